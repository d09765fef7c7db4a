//! The `SnapshotDiff` logical node.

use std::fmt;
use std::sync::Arc;

use datafusion::common::{DFSchema, DFSchemaRef, DataFusionError, Result, ScalarValue};
use datafusion::logical_expr::{Expr, LogicalPlan, UserDefinedLogicalNodeCore};

use crate::fold::snapshot_diff::diff_output_schema;

/// Diffs a snapshot against the target's live rows and produces
/// the change events at the snapshot's version, which feed `AutoCdc`.
///
/// Input: `[target columns..., __cdc_side]` — the live rows (side 0) and the
/// snapshot rows (side 1). Output: events `[target columns..., __cdc_seq,
/// __cdc_kind, __cdc_written_at, __cdc_origin]`.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct SnapshotDiffNode {
    /// Flow (for messages and EXPLAIN).
    pub flow: String,
    /// Key column positions.
    pub key_indices: Vec<usize>,
    /// Snapshot version: the events' sequence.
    pub version: ScalarValue,
    /// Stamp of the rows written by this update.
    pub written_at: ScalarValue,
    /// Tagged live ∪ snapshot rows.
    pub input: Arc<LogicalPlan>,
    schema: DFSchemaRef,
}

impl PartialOrd for SnapshotDiffNode {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        // (agrees with equality: nodes that differ elsewhere are unordered)
        (&self.flow, &self.version)
            .partial_cmp(&(&other.flow, &other.version))
            .filter(|o| o.is_ne() || self == other)
    }
}

impl SnapshotDiffNode {
    /// Create the node.
    pub fn try_new(
        flow: String,
        key_indices: Vec<usize>,
        version: ScalarValue,
        written_at: ScalarValue,
        input: LogicalPlan,
    ) -> Result<Self> {
        let output = diff_output_schema(
            input.schema().as_arrow(),
            &version.data_type(),
            &written_at.data_type(),
        );
        let schema = Arc::new(DFSchema::try_from(output.as_ref().clone())?);
        Ok(Self {
            flow,
            key_indices,
            version,
            written_at,
            input: Arc::new(input),
            schema,
        })
    }

    /// Key column names.
    pub fn key_names(&self) -> Vec<String> {
        self.key_indices
            .iter()
            .map(|&i| self.input.schema().field(i).name().clone())
            .collect()
    }
}

impl UserDefinedLogicalNodeCore for SnapshotDiffNode {
    fn name(&self) -> &str {
        "SnapshotDiff"
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
            "SnapshotDiff: flow={}, keys=[{}], version={}",
            self.flow,
            self.key_names().join(", "),
            self.version
        )
    }

    fn with_exprs_and_inputs(
        &self,
        _exprs: Vec<Expr>,
        mut inputs: Vec<LogicalPlan>,
    ) -> Result<Self> {
        let input = inputs
            .pop()
            .ok_or_else(|| DataFusionError::Internal("SnapshotDiff needs one input".into()))?;
        Self::try_new(
            self.flow.clone(),
            self.key_indices.clone(),
            self.version.clone(),
            self.written_at.clone(),
            input,
        )
    }
}
