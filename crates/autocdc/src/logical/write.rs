//! The `CdcWrite` logical node.

use std::fmt;
use std::sync::Arc;

use datafusion::common::{DFSchema, DFSchemaRef, DataFusionError, Result};
use datafusion::logical_expr::{Expr, LogicalPlan, UserDefinedLogicalNodeCore};

use crate::table::commit::ChangeFeed;
use crate::table::manifest::manifest_schema;
use crate::table::writer::FileCompression;
use crate::table::TableName;

/// Where and how an update's rows are written: data only (the writer finds
/// the object store of `location` when it runs).
#[derive(Debug, PartialEq, Eq, Hash, PartialOrd)]
pub struct WriteRequest {
    /// Target name.
    pub target: TableName,
    /// The flow being run (for messages).
    pub flow: String,
    /// The table's state store: the writer writes under it, through the
    /// store its task's `RuntimeEnv` has for it (see
    /// [`crate::physical::StoreResolver`]).
    pub location: url::Url,
    /// Number of key buckets of the table.
    pub buckets: i32,
    /// Codec of the files written.
    pub compression: FileCompression,
    /// Key column positions in the fold output.
    pub key_indices: Vec<usize>,
    /// Whether change data files are written.
    pub change_feed: ChangeFeed,
}

impl fmt::Display for WriteRequest {
    fn fmt(&self, f: &mut fmt::Formatter) -> fmt::Result {
        write!(f, "target={}, buckets={}", self.target, self.buckets)?;
        if self.compression != FileCompression::default() {
            write!(f, ", compression={}", self.compression.name())?;
        }
        if self.change_feed == ChangeFeed::FromAdds {
            // a first load: no change file
            write!(f, ", change_feed=from_adds")?;
        }
        Ok(())
    }
}

/// Writes the new state produced by its input (the fold) into data and
/// change data feed files and returns their manifest (see
/// [`crate::table::manifest`]); nothing is committed.
#[derive(Debug, Clone)]
pub struct CdcWriteNode {
    /// Where to write.
    pub request: Arc<WriteRequest>,
    /// The new state.
    pub input: Arc<LogicalPlan>,
    schema: DFSchemaRef,
}

impl CdcWriteNode {
    /// Create the node.
    pub fn try_new(request: Arc<WriteRequest>, input: LogicalPlan) -> Result<Self> {
        let schema = Arc::new(DFSchema::try_from(manifest_schema().as_ref().clone())?);
        Ok(Self {
            request,
            input: Arc::new(input),
            schema,
        })
    }
}

impl PartialEq for CdcWriteNode {
    fn eq(&self, other: &Self) -> bool {
        self.request == other.request && self.input == other.input
    }
}
impl Eq for CdcWriteNode {}
impl std::hash::Hash for CdcWriteNode {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.request.hash(state);
        self.input.hash(state);
    }
}
impl PartialOrd for CdcWriteNode {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        // (agrees with equality: nodes writing alike that are not equal are
        // unordered)
        self.request
            .partial_cmp(&other.request)
            .filter(|o| o.is_ne() || self == other)
    }
}

impl UserDefinedLogicalNodeCore for CdcWriteNode {
    fn name(&self) -> &str {
        "CdcWrite"
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
        write!(f, "CdcWrite: {}", self.request)
    }

    fn with_exprs_and_inputs(
        &self,
        _exprs: Vec<Expr>,
        mut inputs: Vec<LogicalPlan>,
    ) -> Result<Self> {
        let input = inputs
            .pop()
            .ok_or_else(|| DataFusionError::Internal("CdcWrite needs one input".into()))?;
        Self::try_new(Arc::clone(&self.request), input)
    }
}
