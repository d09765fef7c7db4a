//! Table functions installed by the extension.

mod as_of;
pub(crate) mod debezium;
mod event_log;
mod snapshot_version;
mod stream;
mod table_as_of;
pub(crate) mod table_changes;

pub use as_of::{BitemporalAsOfFunction, Scd2AsOfFunction};
pub use debezium::DebeziumFunction;
pub use event_log::EventLogFunction;
pub use snapshot_version::{
    MisplacedSnapshotVersion, SnapshotVersionFunction, CURRENT_SNAPSHOT_VERSION,
    LAST_SNAPSHOT_VERSION,
};
pub use stream::StreamFunction;
pub use table_as_of::TableAsOfFunction;
pub use table_changes::{TableChangesFunction, TableRegistry};

use std::sync::Arc;

use datafusion::common::{plan_err, DataFusionError, Result};

use crate::table::{ScdTable, TableName};

/// The streaming table a table function names: as SQL names it
/// (`'"Mixed"'` keeps its case, `s.t`), as written (`'Src Tbl'`), or folded
/// to lower case like an unquoted identifier.
pub(crate) fn lookup_table(
    tables: &TableRegistry,
    function: &str,
    name: &str,
) -> Result<Arc<ScdTable>> {
    let tables = tables
        .lock()
        .map_err(|_| DataFusionError::Internal("poisoned table registry".into()))?;
    let as_sql = datafusion::common::TableReference::from(name).to_vec();
    // (as SQL names it first: `'Users'` is `users`, even where a table
    // `"Users"` exists too)
    let found = [
        TableName::from_parts(&as_sql).ok(),
        TableName::parse(name).ok(),
        TableName::parse(&name.to_lowercase()).ok(),
    ]
    .iter()
    .flatten()
    .find_map(|n| tables.get(n).cloned());
    match found {
        Some(table) => Ok(table),
        None => plan_err!("{function}(): '{name}' is not a streaming table"),
    }
}
