//! The library's warnings (a snapshot version skipped because it is not
//! newer than the last one processed, say) printed to stderr as
//! `warning: …` lines; other crates' log records are not shown.

use log::{Level, LevelFilter, Log, Metadata, Record};

/// The crate whose warnings are shown.
const LIBRARY: &str = "datafusion_autocdc";

struct Warnings;

impl Log for Warnings {
    fn enabled(&self, metadata: &Metadata) -> bool {
        metadata.level() <= Level::Warn && metadata.target().starts_with(LIBRARY)
    }

    fn log(&self, record: &Record) {
        if self.enabled(record.metadata()) {
            eprintln!("warning: {}", record.args());
        }
    }

    fn flush(&self) {}
}

static WARNINGS: Warnings = Warnings;

/// Show the library's warnings from now on (once per process; a logger set
/// before wins).
pub fn show() {
    if log::set_logger(&WARNINGS).is_ok() {
        log::set_max_level(LevelFilter::Warn);
    }
}
