//! Fuzz target: arbitrary UTF-8 fed to the AUTO CDC SQL front end
//! (`parse_cdc_statement`), under every documented dialect, with and without
//! identifier normalisation. It must return `Ok(None)` (not ours), a parsed
//! statement, or an error — never panic, overflow the stack or hang.

#![no_main]

use datafusion_autocdc::sql::parse_cdc_statement;
use libfuzzer_sys::fuzz_target;

/// The dialects the README documents for `datafusion.sql_parser.dialect`.
const DIALECTS: [&str; 3] = ["generic", "databricks", "postgresql"];

fuzz_target!(|data: &[u8]| {
    let Ok(sql) = std::str::from_utf8(data) else {
        return;
    };
    for dialect in DIALECTS {
        for normalize in [true, false] {
            if let Ok(Some(statement)) = parse_cdc_statement(sql, dialect, normalize) {
                // a parsed statement is a plain value: formatting it must not panic
                std::hint::black_box(format!("{statement:?}"));
            }
        }
    }
});
