//! `table_changes('target', from_version [, to_version])`: the change data
//! feed of a streaming table's published table ([`crate::table::changes`]).
//! Versions are inclusive.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use datafusion::catalog::{TableFunctionImpl, TableProvider};
use datafusion::common::{plan_err, Result, ScalarValue};
use datafusion::logical_expr::Expr;

use crate::table::changes::changes_provider;
use crate::table::{ScdTable, TableName};

/// The streaming tables of a session, by name.
pub type TableRegistry = Arc<Mutex<HashMap<TableName, Arc<ScdTable>>>>;

/// The `table_changes` table function.
#[derive(Debug)]
pub struct TableChangesFunction {
    tables: TableRegistry,
}

impl TableChangesFunction {
    /// A function over the session's streaming tables.
    pub fn new(tables: TableRegistry) -> Self {
        Self { tables }
    }
}

fn literal(arg: &Expr) -> Option<&ScalarValue> {
    match arg {
        Expr::Literal(v, _) => Some(v),
        _ => None,
    }
}

fn version_arg(arg: &Expr, what: &str) -> Result<u64> {
    // integers only: 1.9 is no version (a cast would make it 1), and a
    // time is not one either
    let value = literal(arg)
        .filter(|v| v.data_type().is_integer() || v.data_type().is_string())
        .and_then(|v| v.cast_to(&arrow::datatypes::DataType::Int64).ok());
    match (value, literal(arg)) {
        (Some(ScalarValue::Int64(Some(v))), _) if v >= 0 => Ok(v as u64),
        (_, Some(time)) if time.data_type().is_temporal() => plan_err!(
            "table_changes(): {what} is a commit version, not a time: event_log('t') gives \
             each commit's version and time"
        ),
        (_, Some(written)) => plan_err!(
            "table_changes(): {what} must be a non-negative integer commit version, got {written}"
        ),
        (_, None) => plan_err!(
            "table_changes(): {what} must be a non-negative integer commit version, got {arg}"
        ),
    }
}

impl TableFunctionImpl for TableChangesFunction {
    fn call(&self, args: &[Expr]) -> Result<Arc<dyn TableProvider>> {
        let (name, from, to) = match args {
            [name, from] => (name, version_arg(from, "from_version")?, None),
            [name, from, to] => (
                name,
                version_arg(from, "from_version")?,
                Some(version_arg(to, "to_version")?),
            ),
            _ => {
                return plan_err!(
                "table_changes('target', from_version [, to_version]) takes two or three arguments"
            )
            }
        };
        let Some(ScalarValue::Utf8(Some(name)) | ScalarValue::Utf8View(Some(name))) = literal(name)
        else {
            return plan_err!("table_changes(): the first argument is a streaming table name as a string, got {name}");
        };
        let table = super::lookup_table(&self.tables, "table_changes", name)?;
        let latest = table.delta().version().unwrap_or(0);
        let range = match to {
            Some(to) => format!("{from}, {to}"),
            None => from.to_string(),
        };
        if from > latest {
            return plan_err!(
                "table_changes('{name}', {range}): the table's versions are 0 to {latest}"
            );
        }
        if let Some(to) = to.filter(|&to| to < from) {
            return plan_err!(
                "table_changes('{name}', {range}): to_version {to} is before from_version {from}"
            );
        }
        changes_provider(&table, from, to)
    }
}
