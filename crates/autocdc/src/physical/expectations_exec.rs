//! `ExpectationsExec`: checks a target's expectations on the events a flow
//! brings (rules: [`crate::spec::expectations`]).
//!
//! ```text
//!  AutoCdcExec
//!    ExpectationsExec: flow=f, expectations=[valid_id DROP ROW, …]
//!      (the flow's events: target columns, then __cdc_*)
//! ```
//!
//! Per batch, each condition is evaluated once over the whole batch; rows
//! that fail a `DROP ROW` expectation are filtered out, a row failing a
//! `FAIL UPDATE` expectation fails the stream with the constraint, the flow
//! and that row. Truncate events are passed on unchecked. Counts go to the
//! update's [`ExpectationCounts`] (for its commit) and to this operator's
//! metrics (`EXPLAIN ANALYZE`). The operator cannot travel to a cluster:
//! its counts live in this process.

use std::fmt;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use arrow::array::{Array, AsArray, BooleanArray, RecordBatch};
use arrow::compute::kernels::boolean::{and, not, or};
use arrow::compute::{filter_record_batch, prep_null_mask_filter};
use arrow::datatypes::{Int8Type, SchemaRef};
use arrow::util::display::{ArrayFormatter, FormatOptions};
use datafusion::common::tree_node::TreeNodeRecursion;
use datafusion::common::{DataFusionError, Result};
use datafusion::execution::{RecordBatchStream, SendableRecordBatchStream, TaskContext};
use datafusion::physical_expr::PhysicalExpr;
use datafusion::physical_plan::metrics::{
    Count, ExecutionPlanMetricsSet, MetricBuilder, MetricsSet,
};
use datafusion::physical_plan::{
    DisplayAs, DisplayFormatType, ExecutionPlan, ExecutionPlanProperties, PlanProperties,
};
use futures::{Stream, StreamExt};

use crate::fold::columns::{Kind, INTERNAL_PREFIX, KIND_COL};
use crate::spec::expectations::{ExpectationCounts, OnViolation};
use crate::table::reject_sink::RejectSink;

/// Checks expectations on a flow's events (see the module docs).
#[derive(Debug)]
pub struct ExpectationsExec {
    flow: String,
    /// One condition per expectation of `counts`, over the input's columns.
    conditions: Vec<Arc<dyn PhysicalExpr>>,
    counts: Arc<ExpectationCounts>,
    /// Where dropped rows go (a target with rejects on).
    rejects: Option<Arc<RejectSink>>,
    input: Arc<dyn ExecutionPlan>,
    properties: Arc<PlanProperties>,
    metrics: ExecutionPlanMetricsSet,
}

impl ExpectationsExec {
    /// Check `conditions` (those of `counts`' expectations, in order) on
    /// the events of `flow`.
    pub fn try_new(
        flow: String,
        conditions: Vec<Arc<dyn PhysicalExpr>>,
        counts: Arc<ExpectationCounts>,
        input: Arc<dyn ExecutionPlan>,
    ) -> Result<Self> {
        if conditions.len() != counts.expectations().len() {
            return Err(DataFusionError::Internal(format!(
                "ExpectationsExec: {} conditions for {} expectations",
                conditions.len(),
                counts.expectations().len()
            )));
        }
        input.schema().index_of(KIND_COL)?;
        let properties = Arc::new(PlanProperties::new(
            input.equivalence_properties().clone(),
            input.output_partitioning().clone(),
            input.pipeline_behavior(),
            input.boundedness(),
        ));
        Ok(Self {
            flow,
            conditions,
            counts,
            rejects: None,
            input,
            properties,
            metrics: ExecutionPlanMetricsSet::new(),
        })
    }
}

impl ExpectationsExec {
    /// The same check, its dropped rows going to `rejects`.
    pub fn with_rejects(mut self, rejects: Option<Arc<RejectSink>>) -> Self {
        self.rejects = rejects;
        self
    }
}

impl DisplayAs for ExpectationsExec {
    fn fmt_as(&self, t: DisplayFormatType, f: &mut fmt::Formatter) -> fmt::Result {
        let names: Vec<String> = self
            .counts
            .expectations()
            .iter()
            .map(|e| match e.on_violation {
                OnViolation::Keep => e.name.clone(),
                OnViolation::DropRow => format!("{} DROP ROW", e.name),
                OnViolation::FailUpdate => format!("{} FAIL UPDATE", e.name),
            })
            .collect();
        match t {
            DisplayFormatType::Default | DisplayFormatType::Verbose => write!(
                f,
                "ExpectationsExec: flow={}, expectations=[{}]",
                self.flow,
                names.join(", ")
            ),
            DisplayFormatType::TreeRender => {
                writeln!(f, "flow={}", self.flow)?;
                write!(f, "expectations={}", names.join(", "))
            }
        }
    }
}

impl ExecutionPlan for ExpectationsExec {
    fn name(&self) -> &str {
        "ExpectationsExec"
    }

    fn properties(&self) -> &Arc<PlanProperties> {
        &self.properties
    }

    fn children(&self) -> Vec<&Arc<dyn ExecutionPlan>> {
        vec![&self.input]
    }

    fn maintains_input_order(&self) -> Vec<bool> {
        vec![true]
    }

    fn apply_expressions(
        &self,
        f: &mut dyn FnMut(&Arc<dyn PhysicalExpr>) -> Result<TreeNodeRecursion>,
    ) -> Result<TreeNodeRecursion> {
        for condition in &self.conditions {
            if f(condition)? == TreeNodeRecursion::Stop {
                return Ok(TreeNodeRecursion::Stop);
            }
        }
        Ok(TreeNodeRecursion::Continue)
    }

    fn with_new_children(
        self: Arc<Self>,
        mut children: Vec<Arc<dyn ExecutionPlan>>,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        let input = children
            .pop()
            .ok_or_else(|| DataFusionError::Internal("ExpectationsExec needs one child".into()))?;
        Ok(Arc::new(
            Self::try_new(
                self.flow.clone(),
                self.conditions.clone(),
                Arc::clone(&self.counts),
                input,
            )?
            .with_rejects(self.rejects.clone()),
        ))
    }

    fn execute(
        &self,
        partition: usize,
        context: Arc<TaskContext>,
    ) -> Result<SendableRecordBatchStream> {
        let input = self.input.execute(partition, context)?;
        let schema = self.input.schema();
        let kind = schema.index_of(KIND_COL)?;
        let counter = |what: &str, name: &str| {
            MetricBuilder::new(&self.metrics).counter(format!("{what}_{name}"), partition)
        };
        let names = self.counts.expectations().iter().map(|e| &e.name);
        let (passed, failed) = names
            .map(|n| (counter("passed", n), counter("failed", n)))
            .unzip();
        Ok(Box::pin(ExpectationsStream {
            input,
            schema,
            kind,
            flow: self.flow.clone(),
            conditions: self.conditions.clone(),
            counts: Arc::clone(&self.counts),
            rejects: self.rejects.clone(),
            passed,
            failed,
            output_rows: MetricBuilder::new(&self.metrics).output_rows(partition),
        }))
    }

    fn metrics(&self) -> Option<MetricsSet> {
        Some(self.metrics.clone_inner())
    }
}

/// One partition's events, checked.
struct ExpectationsStream {
    input: SendableRecordBatchStream,
    schema: SchemaRef,
    kind: usize,
    flow: String,
    conditions: Vec<Arc<dyn PhysicalExpr>>,
    counts: Arc<ExpectationCounts>,
    rejects: Option<Arc<RejectSink>>,
    passed: Vec<Count>,
    failed: Vec<Count>,
    output_rows: Count,
}

impl ExpectationsStream {
    fn check(&self, batch: RecordBatch) -> Result<RecordBatch> {
        let kinds = batch
            .column(self.kind)
            .as_primitive_opt::<Int8Type>()
            .ok_or_else(|| DataFusionError::Internal(format!("{KIND_COL} is not Int8")))?;
        // rows to check: every event but truncates
        let checked = is_true(&BooleanArray::from_unary(kinds, |k| {
            k != Kind::Truncate as i8
        }));
        let mut dropped: Option<BooleanArray> = None;
        for (i, condition) in self.conditions.iter().enumerate() {
            let value = match condition
                .evaluate(&batch)
                .and_then(|v| v.into_array(batch.num_rows()))
            {
                Ok(value) => value,
                Err(e) => return Err(self.evaluation_error(i, condition, &batch, e)),
            };
            let value = value.as_boolean_opt().ok_or_else(|| {
                DataFusionError::Plan(format!(
                    "flow '{}': expectation '{}': EXPECT ({}) is of type {}, not BOOLEAN",
                    self.flow,
                    self.counts.expectations()[i].name,
                    self.counts.expectations()[i].condition,
                    value.data_type()
                ))
            })?;
            // fails: checked and not TRUE (FALSE or NULL)
            let fails = and(&checked, &not(&is_true(value))?)?;
            let failed = fails.true_count();
            let passed = checked.true_count() - failed;
            self.counts.add(i, passed as u64, failed as u64);
            self.passed[i].add(passed);
            self.failed[i].add(failed);
            if failed == 0 {
                continue;
            }
            let expectation = &self.counts.expectations()[i];
            match expectation.on_violation {
                OnViolation::Keep => {}
                OnViolation::DropRow => {
                    if let Some(rejects) = &self.rejects {
                        // a row failing several expectations is rejected once
                        let first = match &dropped {
                            Some(d) => and(&fails, &not(d)?)?,
                            None => fails.clone(),
                        };
                        rejects.reject(
                            &batch,
                            &first,
                            &format!(
                                "expectation '{}' (EXPECT ({}) ON VIOLATION DROP ROW)",
                                expectation.name, expectation.condition
                            ),
                        )?;
                    }
                    dropped = Some(match dropped {
                        Some(d) => or(&d, &fails)?,
                        None => fails,
                    });
                }
                OnViolation::FailUpdate => {
                    let row = fails.values().set_indices().next().unwrap_or(0);
                    return Err(DataFusionError::Execution(format!(
                        "flow '{}': expectation '{}' (EXPECT ({}) ON VIOLATION FAIL UPDATE) failed on the row {}; nothing was committed",
                        self.flow,
                        expectation.name,
                        expectation.condition,
                        describe_row(&batch, row)?
                    )));
                }
            }
        }
        match dropped {
            Some(dropped) => Ok(filter_record_batch(&batch, &not(&dropped)?)?),
            None => Ok(batch),
        }
    }
}

impl ExpectationsStream {
    /// The error of expectation `i`, whose `condition` could not be
    /// evaluated over `batch`: it names the flow, the expectation and the
    /// first row it fails on (found row by row, on this error path only).
    fn evaluation_error(
        &self,
        i: usize,
        condition: &Arc<dyn PhysicalExpr>,
        batch: &RecordBatch,
        error: DataFusionError,
    ) -> DataFusionError {
        let expectation = &self.counts.expectations()[i];
        let row = (0..batch.num_rows()).find(|&r| {
            condition
                .evaluate(&batch.slice(r, 1))
                .and_then(|v| v.into_array(1))
                .is_err()
        });
        let on_row = match row.map(|r| describe_row(batch, r)) {
            Some(Ok(row)) => format!(" on the row {row}"),
            _ => String::new(),
        };
        DataFusionError::Execution(format!(
            "flow '{}': expectation '{}' (EXPECT ({})) cannot be evaluated{on_row}: {}; nothing \
             was committed",
            self.flow,
            expectation.name,
            expectation.condition,
            error.strip_backtrace()
        ))
    }
}

/// Where `values` is TRUE (NULL: false), without nulls.
fn is_true(values: &BooleanArray) -> BooleanArray {
    match values.nulls() {
        Some(_) => prep_null_mask_filter(values),
        None => values.clone(),
    }
}

/// `(c1=v1, c2=v2, …)`: the user columns of row `row` of `batch`.
fn describe_row(batch: &RecordBatch, row: usize) -> Result<String> {
    let options = FormatOptions::default().with_null("NULL");
    let mut parts = Vec::new();
    for (field, column) in batch.schema().fields().iter().zip(batch.columns()) {
        if field.name().starts_with(INTERNAL_PREFIX) {
            continue;
        }
        let formatter = ArrayFormatter::try_new(column.as_ref(), &options)?;
        parts.push(format!("{}={}", field.name(), formatter.value(row)));
    }
    Ok(format!("({})", parts.join(", ")))
}

impl Stream for ExpectationsStream {
    type Item = Result<RecordBatch>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        match self.input.poll_next_unpin(cx) {
            Poll::Ready(Some(Ok(batch))) => {
                let out = self.check(batch);
                if let Ok(batch) = &out {
                    self.output_rows.add(batch.num_rows());
                }
                Poll::Ready(Some(out))
            }
            other => other,
        }
    }
}

impl RecordBatchStream for ExpectationsStream {
    fn schema(&self) -> SchemaRef {
        Arc::clone(&self.schema)
    }
}
