//! The `Expectations` logical node: a target's expectations checked on the
//! events a flow brings, before the fold (see [`crate::spec::expectations`]).

use std::fmt;
use std::sync::Arc;

use datafusion::common::{DFSchemaRef, DataFusionError, Result};
use datafusion::logical_expr::{Expr, LogicalPlan, UserDefinedLogicalNodeCore};

use crate::spec::expectations::ExpectationCounts;
use crate::table::reject_sink::RejectSink;

/// Checks `conditions` (one per expectation of `counts`) on its input's
/// rows; its output is its input less the rows a `DROP ROW` expectation
/// drops.
#[derive(Debug, Clone)]
pub struct ExpectationsNode {
    /// The flow whose events are checked (for messages).
    pub flow: String,
    /// The conditions, over the input's columns.
    pub conditions: Vec<Expr>,
    /// Where the update's counts go.
    pub counts: Arc<ExpectationCounts>,
    /// Where dropped rows go (a target with rejects on).
    pub rejects: Option<Arc<RejectSink>>,
    /// The events.
    pub input: Arc<LogicalPlan>,
}

impl ExpectationsNode {
    /// Check `conditions` of `counts`' expectations on `input`.
    pub fn new(
        flow: String,
        conditions: Vec<Expr>,
        counts: Arc<ExpectationCounts>,
        input: LogicalPlan,
    ) -> Self {
        Self {
            flow,
            conditions,
            counts,
            rejects: None,
            input: Arc::new(input),
        }
    }

    /// The same check, its dropped rows going to `rejects`.
    pub fn with_rejects(mut self, rejects: Option<Arc<RejectSink>>) -> Self {
        self.rejects = rejects;
        self
    }
}

impl PartialEq for ExpectationsNode {
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.counts, &other.counts)
            && self.conditions == other.conditions
            && self.input == other.input
    }
}
impl Eq for ExpectationsNode {}
impl std::hash::Hash for ExpectationsNode {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.flow.hash(state);
        self.conditions.hash(state);
        self.input.hash(state);
    }
}
impl PartialOrd for ExpectationsNode {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        (&self.flow, &self.conditions)
            .partial_cmp(&(&other.flow, &other.conditions))
            .filter(|o| o.is_ne() || self == other)
    }
}

impl UserDefinedLogicalNodeCore for ExpectationsNode {
    fn name(&self) -> &str {
        "Expectations"
    }

    fn inputs(&self) -> Vec<&LogicalPlan> {
        vec![&self.input]
    }

    fn schema(&self) -> &DFSchemaRef {
        self.input.schema()
    }

    fn expressions(&self) -> Vec<Expr> {
        self.conditions.clone()
    }

    fn fmt_for_explain(&self, f: &mut fmt::Formatter) -> fmt::Result {
        let names: Vec<&str> = self
            .counts
            .expectations()
            .iter()
            .map(|e| e.name.as_str())
            .collect();
        write!(
            f,
            "Expectations: flow={}, expectations=[{}]",
            self.flow,
            names.join(", ")
        )
    }

    fn with_exprs_and_inputs(
        &self,
        exprs: Vec<Expr>,
        mut inputs: Vec<LogicalPlan>,
    ) -> Result<Self> {
        let input = inputs
            .pop()
            .ok_or_else(|| DataFusionError::Internal("Expectations needs one input".into()))?;
        Ok(
            Self::new(self.flow.clone(), exprs, Arc::clone(&self.counts), input)
                .with_rejects(self.rejects.clone()),
        )
    }
}
