//! `last_snapshot_version()` and `current_snapshot_version()`.
//!
//! Each returns a one-column table whose column has the name and type of the
//! version query's output: `last_snapshot_version()` zero or one row (the
//! last version the flow processed), `current_snapshot_version()` one row (the
//! version being processed). They are bound per flow run, only inside the
//! query they belong to; anywhere else they are an error.

use std::sync::Arc;

use arrow::array::RecordBatch;
use arrow::datatypes::{DataType, Field, Schema};
use datafusion::catalog::{TableFunctionImpl, TableProvider};
use datafusion::common::{plan_err, Result, ScalarValue};
use datafusion::datasource::MemTable;
use datafusion::logical_expr::Expr;

/// Name of the function giving the last processed version.
pub const LAST_SNAPSHOT_VERSION: &str = "last_snapshot_version";
/// Name of the function giving the version being processed.
pub const CURRENT_SNAPSHOT_VERSION: &str = "current_snapshot_version";

/// A version table bound for one query of one flow run.
#[derive(Debug)]
pub struct SnapshotVersionFunction {
    name: &'static str,
    column: String,
    data_type: DataType,
    value: Option<ScalarValue>,
}

impl SnapshotVersionFunction {
    /// `name()` returning `value` (no row when `None`) in column `column`.
    pub fn new(
        name: &'static str,
        column: String,
        data_type: DataType,
        value: Option<ScalarValue>,
    ) -> Self {
        Self {
            name,
            column,
            data_type,
            value,
        }
    }
}

impl TableFunctionImpl for SnapshotVersionFunction {
    fn call(&self, args: &[Expr]) -> Result<Arc<dyn TableProvider>> {
        if !args.is_empty() {
            return plan_err!("{}() takes no arguments", self.name);
        }
        let schema = Arc::new(Schema::new(vec![Field::new(
            &self.column,
            self.data_type.clone(),
            true,
        )]));
        let batches = match &self.value {
            Some(v) => vec![RecordBatch::try_new(
                Arc::clone(&schema),
                vec![v.cast_to(&self.data_type)?.to_array()?],
            )?],
            None => vec![],
        };
        Ok(Arc::new(MemTable::try_new(schema, vec![batches])?))
    }
}

/// The functions outside the query they belong to: a clear error.
#[derive(Debug)]
pub struct MisplacedSnapshotVersion {
    name: &'static str,
    allowed_in: &'static str,
}

impl MisplacedSnapshotVersion {
    /// `last_snapshot_version()` outside a WITH VERSION query.
    pub fn last() -> Self {
        Self {
            name: LAST_SNAPSHOT_VERSION,
            allowed_in: "the WITH VERSION query of a snapshot flow",
        }
    }
    /// `current_snapshot_version()` outside a FROM SNAPSHOT query.
    pub fn current() -> Self {
        Self {
            name: CURRENT_SNAPSHOT_VERSION,
            allowed_in: "the FROM SNAPSHOT query of a snapshot flow",
        }
    }
}

impl TableFunctionImpl for MisplacedSnapshotVersion {
    fn call(&self, _args: &[Expr]) -> Result<Arc<dyn TableProvider>> {
        plan_err!("{}() is only allowed inside {}", self.name, self.allowed_in)
    }
}
