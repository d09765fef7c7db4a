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
    let value = literal(arg).and_then(|v| v.cast_to(&arrow::datatypes::DataType::Int64).ok());
    match value {
        Some(ScalarValue::Int64(Some(v))) if v >= 0 => Ok(v as u64),
        _ => plan_err!(
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
