//! The `AutoCdc` logical node.

use std::fmt;
use std::sync::Arc;

use datafusion::common::{DFSchema, DFSchemaRef, Result};
use datafusion::logical_expr::{Expr, LogicalPlan, UserDefinedLogicalNodeCore};

use crate::fold::EventLayout;

/// Folds change events into the new stored state of an SCD 1 target.
///
/// Inputs:
/// 0. events `[target columns..., __cdc_seq, __cdc_kind, __cdc_origin]` —
///    the target's stored rows (origin 0) and the flow's new UPSERT/DELETE
///    events (origin 1);
/// 1. truncate sequences `[__cdc_seq]` — new TRUNCATE events and the stored
///    truncate watermark.
///
/// Output: the complete new stored state `[target columns..., __cdc_seq,
/// __cdc_kind]` (live rows, tombstones and the watermark row).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct AutoCdcNode {
    /// Flow being applied (for messages and EXPLAIN).
    pub flow: String,
    /// Column positions of the event input.
    pub layout: EventLayout,
    /// Event input.
    pub events: Arc<LogicalPlan>,
    /// Truncate sequences input.
    pub truncates: Arc<LogicalPlan>,
    schema: DFSchemaRef,
}

impl PartialOrd for AutoCdcNode {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        (&self.flow, &self.layout).partial_cmp(&(&other.flow, &other.layout))
    }
}

impl PartialOrd for EventLayout {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        (&self.target_columns, &self.key_indices)
            .partial_cmp(&(&other.target_columns, &other.key_indices))
    }
}

impl AutoCdcNode {
    /// Create the node; the output schema is the event schema without `__cdc_origin`.
    pub fn try_new(
        flow: String,
        layout: EventLayout,
        events: LogicalPlan,
        truncates: LogicalPlan,
    ) -> Result<Self> {
        let input = events.schema();
        let fields: Vec<_> = (0..layout.origin())
            .map(|i| {
                let (q, f) = input.qualified_field(i);
                (q.cloned(), Arc::new(f.as_ref().clone().with_nullable(true)))
            })
            .collect();
        let schema = Arc::new(DFSchema::new_with_metadata(fields, Default::default())?);
        Ok(Self {
            flow,
            layout,
            events: Arc::new(events),
            truncates: Arc::new(truncates),
            schema,
        })
    }

    /// Key column names.
    pub fn key_names(&self) -> Vec<&str> {
        self.layout
            .key_indices
            .iter()
            .map(|&i| self.layout.target_columns[i].as_str())
            .collect()
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
            "AutoCdc: flow={}, keys=[{}], stored_as=SCD TYPE 1",
            self.flow,
            self.key_names().join(", ")
        )
    }

    fn with_exprs_and_inputs(
        &self,
        _exprs: Vec<Expr>,
        mut inputs: Vec<LogicalPlan>,
    ) -> Result<Self> {
        let truncates = inputs.pop().ok_or_else(|| {
            datafusion::common::DataFusionError::Internal("AutoCdc needs two inputs".into())
        })?;
        let events = inputs.pop().ok_or_else(|| {
            datafusion::common::DataFusionError::Internal("AutoCdc needs two inputs".into())
        })?;
        Self::try_new(self.flow.clone(), self.layout.clone(), events, truncates)
    }
}
