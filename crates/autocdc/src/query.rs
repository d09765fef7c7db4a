//! AUTO CDC in a query: the fold as a relation over any `DataFrame` of
//! change events, no storage and no state — what a flow's target would
//! hold after one update from an empty target (SPEC §4.10).
//!
//! ```text
//!  Projection: the target's columns (user and SCD columns, no __cdc_*)
//!    Filter: __cdc_kind = upsert          live rows and versions only
//!      AutoCdc: the flow's fold           the same operator as flows
//!        (events, resolved as a flow's)   (truncates: its second input)
//! ```
//!
//! The flow's clauses, validation and messages are a flow's: the spec is
//! resolved by [`crate::spec::resolve`] against an empty target. The
//! session must know the operators ([`crate::AutoCdc::install`]; a
//! [`crate::CdcSession`] does).

use std::ops::Not;
use std::sync::Arc;

use datafusion::common::{Column, Result, ScalarValue};
use datafusion::logical_expr::{cast, col, lit, Expr, Extension, LogicalPlan, LogicalPlanBuilder};
use datafusion::prelude::DataFrame;

use crate::fold::columns::{Kind, INTERNAL_PREFIX, KIND_COL, SEQ_COL};
use crate::logical::AutoCdcNode;
use crate::pipeline::fold_spec;
use crate::spec::resolve::{resolve, TargetShape};
use crate::spec::FlowSpec;

/// AUTO CDC over a `DataFrame` of change events.
pub trait AutoCdcDataFrame {
    /// The rows a target of `flow`'s kind would hold after one update from
    /// an empty target, with these events as its source (`flow.source` is
    /// not read). SCD 2 rows carry `__START_AT` / `__END_AT`, BITEMPORAL
    /// rows the four time columns.
    fn auto_cdc(self, flow: &FlowSpec) -> Result<DataFrame>;
}

impl AutoCdcDataFrame for DataFrame {
    fn auto_cdc(self, flow: &FlowSpec) -> Result<DataFrame> {
        let (state, events) = self.into_parts();
        let now = state.execution_props().query_execution_start_time;
        let now_micros = now.map_or(0, |t| t.timestamp_micros());
        let resolved = resolve(
            &state,
            flow,
            events,
            &TargetShape::default(),
            now_micros,
            None,
        )?;
        let kind_is = |k: Kind| col(KIND_COL).eq(lit(k as i8));
        let (rows, truncates) = match flow.apply_as_truncates {
            Some(_) => (
                LogicalPlanBuilder::from(resolved.events.clone())
                    .filter(kind_is(Kind::Truncate).not())?
                    .build()?,
                LogicalPlanBuilder::from(resolved.events.clone())
                    .filter(kind_is(Kind::Truncate))?
                    .project(vec![col(SEQ_COL)])?
                    .build()?,
            ),
            None => (
                resolved.events.clone(),
                LogicalPlanBuilder::empty(false)
                    .project(vec![cast(
                        lit(ScalarValue::Null),
                        resolved.sequence_type.clone(),
                    )
                    .alias(SEQ_COL)])?
                    .build()?,
            ),
        };
        let fold = fold_spec(&state, flow, &resolved, false);
        let folded = LogicalPlan::Extension(Extension {
            node: Arc::new(AutoCdcNode::try_new(fold, rows, truncates)?),
        });
        let visible: Vec<Expr> = folded
            .schema()
            .fields()
            .iter()
            .filter(|f| !f.name().starts_with(INTERNAL_PREFIX))
            .map(|f| Expr::Column(Column::new_unqualified(f.name())))
            .collect();
        let plan = LogicalPlanBuilder::from(folded)
            .filter(kind_is(Kind::Upsert))?
            .project(visible)?
            .build()?;
        Ok(DataFrame::new(state, plan))
    }
}
