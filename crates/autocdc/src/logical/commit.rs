//! The `CdcCommit` logical node.

use std::fmt;
use std::sync::Arc;

use arrow::datatypes::{DataType, Field, Schema};
use datafusion::common::{DFSchema, DFSchemaRef, Result};
use datafusion::logical_expr::{Expr, LogicalPlan, UserDefinedLogicalNodeCore};

use crate::fold::count;
use crate::table::commit::CommitRequest;

/// Columns of the row an update returns (one row per flow run).
pub const UPDATE_RESULT_COLUMNS: [(&str, DataType); 6] = [
    ("flow", DataType::Utf8),
    (count::RUN[0], DataType::Int64),
    (count::RUN[1], DataType::Int64),
    (count::RUN[2], DataType::Int64),
    (count::RUN[3], DataType::Int64),
    ("commit_version", DataType::Int64),
];

/// Writes the new state produced by its input as one atomic Delta commit
/// (data files, removal of the replaced files, flow definition and
/// checkpoint) and returns the update's metrics row.
#[derive(Debug, Clone)]
pub struct CdcCommitNode {
    /// What to commit, and where.
    pub request: Arc<CommitRequest>,
    /// The new state.
    pub input: Arc<LogicalPlan>,
    schema: DFSchemaRef,
}

impl CdcCommitNode {
    /// Create the node.
    pub fn try_new(request: Arc<CommitRequest>, input: LogicalPlan) -> Result<Self> {
        let fields: Vec<Field> = UPDATE_RESULT_COLUMNS
            .iter()
            .map(|(n, t)| Field::new(*n, t.clone(), *n == "commit_version"))
            .collect();
        let schema = Arc::new(DFSchema::try_from(Schema::new(fields))?);
        Ok(Self {
            request,
            input: Arc::new(input),
            schema,
        })
    }
}

impl PartialEq for CdcCommitNode {
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.request, &other.request) && self.input == other.input
    }
}
impl Eq for CdcCommitNode {}
impl std::hash::Hash for CdcCommitNode {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.request.flow.name.hash(state);
        self.input.hash(state);
    }
}
impl PartialOrd for CdcCommitNode {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        // (agrees with equality: nodes of one flow that are not equal are
        // unordered)
        self.request
            .flow
            .name
            .partial_cmp(&other.request.flow.name)
            .filter(|o| o.is_ne() || self == other)
    }
}

impl UserDefinedLogicalNodeCore for CdcCommitNode {
    fn name(&self) -> &str {
        "CdcCommit"
    }

    fn inputs(&self) -> Vec<&LogicalPlan> {
        vec![&self.input]
    }

    fn schema(&self) -> &DFSchemaRef {
        &self.schema
    }

    fn expressions(&self) -> Vec<Expr> {
        vec![]
    }

    fn fmt_for_explain(&self, f: &mut fmt::Formatter) -> fmt::Result {
        write!(
            f,
            "CdcCommit: target={}, flow={}",
            self.request.target, self.request.flow.name
        )
    }

    fn with_exprs_and_inputs(
        &self,
        _exprs: Vec<Expr>,
        mut inputs: Vec<LogicalPlan>,
    ) -> Result<Self> {
        let input = inputs.pop().ok_or_else(|| {
            datafusion::common::DataFusionError::Internal("CdcCommit needs one input".into())
        })?;
        Self::try_new(Arc::clone(&self.request), input)
    }
}
