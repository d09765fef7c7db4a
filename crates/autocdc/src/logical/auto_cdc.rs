//! The `AutoCdc` logical node.

use std::fmt;
use std::sync::Arc;

use datafusion::common::{DFSchema, DFSchemaRef, DataFusionError, Result};
use datafusion::logical_expr::{Expr, LogicalPlan, UserDefinedLogicalNodeCore};

use crate::fold::{EventLayout, FoldSpec, ScdType};

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
    /// The fold's output is only read as rows (a query's relation, not a
    /// write and not a change feed), so value columns no output needs
    /// may be left out of its input (see
    /// [`AutoCdcNode::necessary_children_exprs`]).
    pub prunable: bool,
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
            prunable: false,
        })
    }

    /// Let the optimizer leave out the value columns no output needs: for
    /// a fold whose rows are read as they are (the relation `AUTO CDC
    /// (…)` without `WITH CHANGES`). Those columns take no part in the
    /// result — an SCD 1 row's other columns and an SCD 2 version's
    /// untracked ones ride along with the winning event — except that two
    /// events of one key and sequence that differ only in them are then no
    /// conflict.
    pub fn with_prunable_columns(mut self) -> Self {
        self.prunable = true;
        self
    }

    /// The same fold over other `events` of the same columns.
    pub fn with_events(&self, events: LogicalPlan) -> Result<Self> {
        Ok(Self {
            prunable: self.prunable,
            ..Self::try_new(self.spec.clone(), events, self.truncates.as_ref().clone())?
        })
    }

    /// `spec` for `events`, an input that may lack some of its target
    /// columns (left out by the optimizer): the layout of the columns it
    /// has.
    fn spec_for(&self, events: &LogicalPlan) -> Result<FoldSpec> {
        let layout = &self.spec.layout;
        let schema = events.schema();
        let old_width = self.events.schema().fields().len();
        if schema.fields().len() == old_width {
            return Ok(self.spec.clone());
        }
        let internal = |m: &str| DataFusionError::Internal(format!("AutoCdc: {m}"));
        let kept: Vec<usize> = (0..layout.num_target())
            .filter(|&c| {
                schema
                    .fields()
                    .iter()
                    .any(|f| f.name() == &layout.target_columns[c])
            })
            .collect();
        let pruned = layout.num_target() - kept.len();
        if !self.prunable || schema.fields().len() + pruned != old_width {
            return Err(internal("an input without columns the fold needs"));
        }
        for (new, &old) in kept.iter().enumerate() {
            if schema.field(new).name() != &layout.target_columns[old] {
                return Err(internal("target columns out of order"));
            }
        }
        let position = |old: usize| -> Result<usize> {
            kept.iter()
                .position(|&c| c == old)
                .ok_or_else(|| internal("a needed column left out"))
        };
        let mut spec = self.spec.clone();
        spec.layout.target_columns = kept
            .iter()
            .map(|&c| layout.target_columns[c].clone())
            .collect();
        spec.layout.key_indices = layout
            .key_indices
            .iter()
            .map(|&k| position(k))
            .collect::<Result<_>>()?;
        // (an SCD 2 fold keeps its tracked columns; SCD 1 tracks nothing)
        spec.tracked = match spec.stored_as {
            ScdType::Type2 => self
                .spec
                .tracked
                .iter()
                .map(|&t| position(t))
                .collect::<Result<_>>()?,
            _ => self
                .spec
                .tracked
                .iter()
                .filter_map(|&t| position(t).ok())
                .collect(),
        };
        Ok(spec)
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

    /// With [`AutoCdcNode::prunable`], the target columns an output needs,
    /// the keys and (SCD 2) the tracked columns, and every bookkeeping
    /// column: the others are left out of the events (SCD 1 and SCD 2
    /// without partial updates or per-column sequencing).
    fn necessary_children_exprs(&self, output_columns: &[usize]) -> Option<Vec<Vec<usize>>> {
        let spec = &self.spec;
        let layout = &spec.layout;
        let simple = self.prunable
            && spec.partial.is_none()
            && layout.sequence_groups.is_empty()
            && matches!(spec.stored_as, ScdType::Type1 | ScdType::Type2);
        if !simple {
            return None;
        }
        let n = layout.num_target();
        let mut keep = vec![false; n];
        // (SCD 1 compares no column to decide its rows)
        let tracked: &[usize] = match spec.stored_as {
            ScdType::Type2 => &spec.tracked,
            _ => &[],
        };
        for &c in layout.key_indices.iter().chain(tracked) {
            keep[c] = true;
        }
        for &o in output_columns.iter().filter(|&&o| o < n) {
            keep[o] = true;
        }
        if keep.iter().all(|&k| k) {
            return None;
        }
        let events = (0..n)
            .filter(|&c| keep[c])
            .chain(n..self.events.schema().fields().len())
            .collect();
        let truncates = (0..self.truncates.schema().fields().len()).collect();
        Some(vec![events, truncates])
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
        let spec = self.spec_for(&events)?;
        Ok(Self {
            prunable: self.prunable,
            ..Self::try_new(spec, events, truncates)?
        })
    }
}
