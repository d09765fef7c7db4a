//! Names of the counts a flow run reports, defined once for every place that
//! shows them: the run's result row, `REFRESH PIPELINE`, the event log, the
//! write manifests and `AutoCdcExec`'s metrics.

use arrow::datatypes::{DataType, Field};

/// New events read.
pub const INPUT_ROWS: &str = "num_input_rows";
/// Live rows inserted or updated.
pub const UPSERTED: &str = "num_upserted_rows";
/// Live rows removed.
pub const DELETED: &str = "num_deleted_rows";
/// Late (or replayed) events dropped.
pub const LATE: &str = "num_late_rows_dropped";
/// Tombstones written.
pub const TOMBSTONES: &str = "num_tombstones_written";
/// Duplicate events dropped.
pub const DUPLICATES: &str = "num_duplicate_rows_dropped";
/// New events added to stored histories (SCD 2).
pub const EVENTS_ADDED: &str = "num_events_added";
/// The counts of a run's result row, in the order every report shows them.
pub const RUN: [&str; 4] = [UPSERTED, DELETED, INPUT_ROWS, LATE];

/// The [`RUN`] columns as nullable BIGINT fields (a report row of a
/// run that did not happen has none).
pub(crate) fn run_count_fields() -> impl Iterator<Item = Field> {
    RUN.into_iter()
        .map(|name| Field::new(name, DataType::Int64, true))
}
