//! Sorts under window operators that name the windows' `PARTITION BY`
//! columns, for plans split into stages.
//!
//! DataFusion sorts a window's input by `PARTITION BY` then `ORDER BY`
//! columns, leaving out a column that a filter below fixes to one value
//! (`WHERE id = 2` under `lead(v) OVER (PARTITION BY id ORDER BY v)` sorts by
//! `v` alone). In one process the window knows the column is constant. On a
//! cluster a shuffle between the filter and the sort starts a new stage
//! whose input (a shuffle reader) knows no constants, and the window there
//! refuses its input ("Expects PARTITION BY expression to be ordered").
//! Sorting by the constant column too costs one comparison of equal values
//! per row and holds in every stage.

use std::sync::Arc;

use datafusion::common::tree_node::{Transformed, TreeNode};
use datafusion::common::Result;
use datafusion::physical_expr::{LexOrdering, PhysicalSortExpr};
use datafusion::physical_plan::sorts::sort::SortExec;
use datafusion::physical_plan::windows::BoundedWindowAggExec;
use datafusion::physical_plan::{replace_children_if_necessary, ExecutionPlan};

/// `plan` with each sort directly under a window led by the window's
/// `PARTITION BY` columns it left out (see the module docs).
pub(crate) fn with_explicit_window_sorts(
    plan: Arc<dyn ExecutionPlan>,
) -> Result<Arc<dyn ExecutionPlan>> {
    plan.transform_up(|node| {
        let Some(window) = node.downcast_ref::<BoundedWindowAggExec>() else {
            return Ok(Transformed::no(node));
        };
        let Some(sort) = window.input().downcast_ref::<SortExec>() else {
            return Ok(Transformed::no(node));
        };
        let Some(first) = window.window_expr().first() else {
            return Ok(Transformed::no(node));
        };
        let missing: Vec<PhysicalSortExpr> = first
            .partition_by()
            .iter()
            .filter(|p| !sort.expr().iter().any(|s| s.expr.as_ref() == p.as_ref()))
            .map(|p| PhysicalSortExpr::new_default(Arc::clone(p)))
            .collect();
        if missing.is_empty() {
            return Ok(Transformed::no(node));
        }
        let Some(ordering) =
            LexOrdering::new(missing.into_iter().chain(sort.expr().iter().cloned()))
        else {
            return Ok(Transformed::no(node));
        };
        let sorted = SortExec::new(ordering, Arc::clone(sort.input()))
            .with_preserve_partitioning(sort.preserve_partitioning())
            .with_fetch(sort.fetch());
        let node = replace_children_if_necessary(node, vec![Arc::new(sorted)])?;
        Ok(Transformed::yes(node))
    })
    .map(|t| t.data)
}
