//! The `Rejects` logical node: a flow's events less those that would fail
//! its update (a NULL key, a NULL sequence), which go to the target's
//! rejects ([`crate::table::rejects`]).

use std::fmt;
use std::sync::Arc;

use datafusion::common::{DFSchemaRef, DataFusionError, Result};
use datafusion::logical_expr::{Expr, LogicalPlan, UserDefinedLogicalNodeCore};

use crate::table::reject_sink::RejectSink;

/// Passes its input's events on, less those with a NULL sequence or (for
/// UPSERT and DELETE events) a NULL key column, which go to `sink`.
#[derive(Debug, Clone)]
pub struct RejectsNode {
    /// Where the rejected events go (it names the flow and its keys).
    pub sink: Arc<RejectSink>,
    /// Whether conflicting events are rejected too (key events); truncate
    /// events are only checked for a NULL sequence.
    pub conflicts: bool,
    /// The events (target columns, then `__cdc_*`).
    pub input: Arc<LogicalPlan>,
}

impl RejectsNode {
    /// Reject the failing events of `input` into `sink`.
    pub fn new(sink: Arc<RejectSink>, input: LogicalPlan) -> Self {
        Self {
            sink,
            conflicts: true,
            input: Arc::new(input),
        }
    }

    /// Reject only the events of `input` with a NULL sequence or key (a
    /// truncate's keys are ignored): truncate events, and a snapshot's rows
    /// (whose duplicate keys the diff refuses: a key rejected for them would
    /// read as deleted).
    pub fn null_checks(sink: Arc<RejectSink>, input: LogicalPlan) -> Self {
        Self {
            conflicts: false,
            ..Self::new(sink, input)
        }
    }
}

impl PartialEq for RejectsNode {
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.sink, &other.sink)
            && self.conflicts == other.conflicts
            && self.input == other.input
    }
}
impl Eq for RejectsNode {}
impl std::hash::Hash for RejectsNode {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.sink.flow().hash(state);
        self.conflicts.hash(state);
        self.input.hash(state);
    }
}
impl PartialOrd for RejectsNode {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        (self.sink.flow(), self.conflicts)
            .partial_cmp(&(other.sink.flow(), other.conflicts))
            .filter(|o| o.is_ne() || self == other)
    }
}

impl UserDefinedLogicalNodeCore for RejectsNode {
    fn name(&self) -> &str {
        "Rejects"
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
        write!(f, "Rejects: flow={}", self.sink.flow())?;
        if !self.conflicts {
            write!(f, ", null checks")?;
        }
        Ok(())
    }

    fn with_exprs_and_inputs(
        &self,
        _exprs: Vec<Expr>,
        mut inputs: Vec<LogicalPlan>,
    ) -> Result<Self> {
        let input = inputs
            .pop()
            .ok_or_else(|| DataFusionError::Internal("Rejects needs one input".into()))?;
        Ok(Self {
            conflicts: self.conflicts,
            ..Self::new(Arc::clone(&self.sink), input)
        })
    }
}
