//! The `AutoCdc` logical node.

use std::fmt;
use std::sync::Arc;

use datafusion::common::{DFSchema, DFSchemaRef, DataFusionError, Result};
use datafusion::logical_expr::{Expr, LogicalPlan, UserDefinedLogicalNodeCore};

use crate::fold::{EventLayout, FoldSpec};

/// Folds change events into the new stored state of a target.
///
/// Inputs:
/// 0. events `[target columns..., __cdc_seq, __cdc_kind, __cdc_origin]` —
///    the target's stored rows or events (origin 0) and the flow's new
///    UPSERT/DELETE events (origin 1);
/// 1. truncate sequences `[__cdc_seq]` or `[__cdc_seq, __cdc_origin]` —
///    new TRUNCATE events (origin 1, or without the column) and the stored
///    truncate watermark (SCD 1, origin 0: it keeps older new events out
///    but removes no stored row).
///
/// Output: the complete new stored state (see [`FoldSpec::output_schema`]).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct AutoCdcNode {
    /// What to fold.
    pub spec: FoldSpec,
    /// Event input.
    pub events: Arc<LogicalPlan>,
    /// Truncate sequences input.
    pub truncates: Arc<LogicalPlan>,
    schema: DFSchemaRef,
}

impl PartialOrd for AutoCdcNode {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        // (agrees with equality: equal specs over other inputs are unordered)
        self.spec
            .partial_cmp(&other.spec)
            .filter(|o| o.is_ne() || self == other)
    }
}

impl PartialOrd for EventLayout {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        (
            &self.target_columns,
            &self.key_indices,
            self.system_seq,
            self.update_list,
            &self.sequence_groups,
            self.group_sequences,
        )
            .partial_cmp(&(
                &other.target_columns,
                &other.key_indices,
                other.system_seq,
                other.update_list,
                &other.sequence_groups,
                other.group_sequences,
            ))
    }
}

impl AutoCdcNode {
    /// Create the node.
    pub fn try_new(spec: FoldSpec, events: LogicalPlan, truncates: LogicalPlan) -> Result<Self> {
        let output = spec.output_schema(events.schema().as_arrow())?;
        let schema = Arc::new(DFSchema::try_from(output.as_ref().clone())?);
        Ok(Self {
            spec,
            events: Arc::new(events),
            truncates: Arc::new(truncates),
            schema,
        })
    }
}

impl UserDefinedLogicalNodeCore for AutoCdcNode {
    fn name(&self) -> &str {
        "AutoCdc"
    }

    fn inputs(&self) -> Vec<&LogicalPlan> {
        vec![&self.events, &self.truncates]
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
            "AutoCdc: flow={}, keys=[{}], stored_as={}",
            self.spec.flow,
            self.spec.key_names().join(", "),
            self.spec.stored_as
        )
    }

    fn with_exprs_and_inputs(
        &self,
        _exprs: Vec<Expr>,
        mut inputs: Vec<LogicalPlan>,
    ) -> Result<Self> {
        let truncates = inputs
            .pop()
            .ok_or_else(|| DataFusionError::Internal("AutoCdc needs two inputs".into()))?;
        let events = inputs
            .pop()
            .ok_or_else(|| DataFusionError::Internal("AutoCdc needs two inputs".into()))?;
        Self::try_new(self.spec.clone(), events, truncates)
    }
}
