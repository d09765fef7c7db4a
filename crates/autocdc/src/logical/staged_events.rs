//! The `StagedEvents` logical node: an update's new change events, read once
//! through its [`UpdateStage`] when the update runs.

use std::fmt;
use std::sync::Arc;

use datafusion::common::{DFSchemaRef, DataFusionError, Result};
use datafusion::logical_expr::{Expr, LogicalPlan, UserDefinedLogicalNodeCore};

use crate::table::stage::UpdateStage;

/// Which of an update's event inputs a [`StagedEventsNode`] is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd)]
pub enum StagedRole {
    /// The events folded with the stored rows: the stage reads them from
    /// this node's input.
    Events,
    /// The events the truncates are taken from: the staged events, or (an
    /// update larger than the stage) this node's input read again.
    Truncates,
}

impl fmt::Display for StagedRole {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Events => "events",
            Self::Truncates => "truncates",
        })
    }
}

/// Passes its input's events on, staged by `stage` (the module docs of
/// [`crate::table::stage`]).
#[derive(Debug, Clone)]
pub struct StagedEventsNode {
    /// The update's stage.
    pub stage: Arc<UpdateStage>,
    /// Which input of the update it is.
    pub role: StagedRole,
    /// The events (target columns, then `__cdc_*`).
    pub input: Arc<LogicalPlan>,
}

impl StagedEventsNode {
    /// Stage `input` as `role` of the update of `stage`.
    pub fn new(stage: Arc<UpdateStage>, role: StagedRole, input: LogicalPlan) -> Self {
        Self {
            stage,
            role,
            input: Arc::new(input),
        }
    }
}

impl PartialEq for StagedEventsNode {
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.stage, &other.stage)
            && self.role == other.role
            && self.input == other.input
    }
}
impl Eq for StagedEventsNode {}
impl std::hash::Hash for StagedEventsNode {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.stage.flow().hash(state);
        self.role.hash(state);
        self.input.hash(state);
    }
}
impl PartialOrd for StagedEventsNode {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        (self.stage.flow(), self.role)
            .partial_cmp(&(other.stage.flow(), other.role))
            .filter(|o| o.is_ne() || self == other)
    }
}

impl UserDefinedLogicalNodeCore for StagedEventsNode {
    fn name(&self) -> &str {
        "StagedEvents"
    }

    fn inputs(&self) -> Vec<&LogicalPlan> {
        vec![&self.input]
    }

    fn schema(&self) -> &DFSchemaRef {
        self.input.schema()
    }

    fn expressions(&self) -> Vec<Expr> {
        vec![]
    }

    fn fmt_for_explain(&self, f: &mut fmt::Formatter) -> fmt::Result {
        write!(
            f,
            "StagedEvents: flow={}, role={}",
            self.stage.flow(),
            self.role
        )
    }

    fn with_exprs_and_inputs(
        &self,
        _exprs: Vec<Expr>,
        mut inputs: Vec<LogicalPlan>,
    ) -> Result<Self> {
        let input = inputs
            .pop()
            .ok_or_else(|| DataFusionError::Internal("StagedEvents needs one input".into()))?;
        Ok(Self::new(Arc::clone(&self.stage), self.role, input))
    }
}
