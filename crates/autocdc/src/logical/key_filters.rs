//! Filters on key columns go below the fold.
//!
//! The fold sequences each key on its own, so the rows it yields for a key
//! depend on that key's events only (and on the truncates, a separate
//! input). A filter above an `AutoCdc` node whose conjuncts read only key
//! columns therefore selects the same rows when it filters the events
//! instead, and the fold then sorts, indexes and holds only the keys the
//! query keeps:
//!
//! ```text
//!  Filter: id = 7 AND city = 'Oslo'          Filter: city = 'Oslo'
//!    AutoCdc                          ──►      AutoCdc
//!      events                                    Filter: id = 7
//!      truncates                                   events
//!                                                truncates
//! ```
//!
//! Conjuncts reading any other column, none at all, or volatile functions
//! stay above the fold. A projection that only picks columns may sit
//! between the filter and the fold. DataFusion's own filter push-down stops at
//! extension nodes whose columns it cannot reason about; this rule knows
//! the one it needs.

use std::collections::HashSet;
use std::sync::Arc;

use datafusion::common::tree_node::Transformed;
use datafusion::common::Result;
use datafusion::logical_expr::expr_rewriter::unnormalize_col;
use datafusion::logical_expr::utils::{conjunction, split_conjunction_owned};
use datafusion::logical_expr::{Expr, Extension, Filter, LogicalPlan, Projection};
use datafusion::optimizer::{ApplyOrder, OptimizerConfig, OptimizerRule};

use super::AutoCdcNode;

/// The optimizer rule (see the module docs).
#[derive(Debug, Default)]
pub struct PushKeyFilters;

impl OptimizerRule for PushKeyFilters {
    fn name(&self) -> &str {
        "push_key_filters_below_auto_cdc"
    }

    fn apply_order(&self) -> Option<ApplyOrder> {
        Some(ApplyOrder::TopDown)
    }

    fn supports_rewrite(&self) -> bool {
        true
    }

    fn rewrite(
        &self,
        plan: LogicalPlan,
        _config: &dyn OptimizerConfig,
    ) -> Result<Transformed<LogicalPlan>> {
        let LogicalPlan::Filter(filter) = &plan else {
            return Ok(Transformed::no(plan));
        };
        // the fold, possibly under a projection that only picks columns
        let (projection, below) = match filter.input.as_ref() {
            LogicalPlan::Projection(p) if p.expr.iter().all(|e| matches!(e, Expr::Column(_))) => {
                (Some(p), p.input.as_ref())
            }
            other => (None, other),
        };
        let LogicalPlan::Extension(extension) = below else {
            return Ok(Transformed::no(plan));
        };
        let Some(node) = extension.node.as_any().downcast_ref::<AutoCdcNode>() else {
            return Ok(Transformed::no(plan));
        };
        let layout = &node.spec.layout;
        let keys: HashSet<&str> = layout
            .key_indices
            .iter()
            .map(|&i| layout.target_columns[i].as_str())
            .collect();
        let (push, keep): (Vec<_>, Vec<_>) = split_conjunction_owned(filter.predicate.clone())
            .into_iter()
            .partition(|conjunct| {
                let columns = conjunct.column_refs();
                !columns.is_empty()
                    && columns.iter().all(|c| keys.contains(c.name.as_str()))
                    && !conjunct.is_volatile()
            });
        let Some(pushed) = conjunction(push.into_iter().map(unnormalize_col)) else {
            return Ok(Transformed::no(plan));
        };
        let events = LogicalPlan::Filter(Filter::try_new(pushed, Arc::clone(&node.events))?);
        let mut folded = LogicalPlan::Extension(Extension {
            node: Arc::new(node.with_events(events)?),
        });
        if let Some(projection) = projection {
            folded = LogicalPlan::Projection(Projection::try_new(
                projection.expr.clone(),
                Arc::new(folded),
            )?);
        }
        Ok(Transformed::yes(match conjunction(keep) {
            Some(rest) => LogicalPlan::Filter(Filter::try_new(rest, Arc::new(folded))?),
            None => folded,
        }))
    }
}
