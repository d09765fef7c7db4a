//! `RejectsExec`: keeps the events that would fail an update out of it, for
//! a target with rejects on ([`crate::table::rejects`]).
//!
//! ```text
//!  AutoCdcExec
//!    RejectsExec: flow=f
//!      [ExpectationsExec]  (its DROP ROW rows go to the same rejects)
//!        (the flow's events: target columns, then __cdc_*)
//! ```
//!
//! Per batch: an event whose sequence is NULL (or holds a NULL field, for a
//! `STRUCT` sequence) is rejected for `NULL sequence`; an UPSERT or DELETE
//! event with a NULL key column for `NULL key column 'k'`; the others pass
//! on, in order. The rejected events go to the run's [`RejectSink`], which
//! its commit writes. Like `ExpectationsExec`, the operator cannot travel to
//! a cluster: its sink lives in this process.

use std::fmt;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use arrow::array::{Array, AsArray, BooleanArray, RecordBatch};
use arrow::compute::kernels::boolean::{and, not, or};
use arrow::compute::{filter_record_batch, is_null};
use arrow::datatypes::{Int8Type, SchemaRef};
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

use crate::fold::columns::{Kind, KIND_COL, SEQ_COL};
use crate::table::reject_sink::RejectSink;

/// Rejects a flow's failing events (see the module docs).
#[derive(Debug)]
pub struct RejectsExec {
    sink: Arc<RejectSink>,
    input: Arc<dyn ExecutionPlan>,
    properties: Arc<PlanProperties>,
    metrics: ExecutionPlanMetricsSet,
}

impl RejectsExec {
    /// Reject the failing events of `input` into `sink`.
    pub fn try_new(sink: Arc<RejectSink>, input: Arc<dyn ExecutionPlan>) -> Result<Self> {
        let schema = input.schema();
        schema.index_of(KIND_COL)?;
        schema.index_of(SEQ_COL)?;
        for key in sink.keys() {
            schema.index_of(key)?;
        }
        let properties = Arc::new(PlanProperties::new(
            input.equivalence_properties().clone(),
            input.output_partitioning().clone(),
            input.pipeline_behavior(),
            input.boundedness(),
        ));
        Ok(Self {
            sink,
            input,
            properties,
            metrics: ExecutionPlanMetricsSet::new(),
        })
    }
}

impl DisplayAs for RejectsExec {
    fn fmt_as(&self, t: DisplayFormatType, f: &mut fmt::Formatter) -> fmt::Result {
        match t {
            DisplayFormatType::Default | DisplayFormatType::Verbose => {
                write!(f, "RejectsExec: flow={}", self.sink.flow())
            }
            DisplayFormatType::TreeRender => write!(f, "flow={}", self.sink.flow()),
        }
    }
}

impl ExecutionPlan for RejectsExec {
    fn name(&self) -> &str {
        "RejectsExec"
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
        _f: &mut dyn FnMut(&Arc<dyn PhysicalExpr>) -> Result<TreeNodeRecursion>,
    ) -> Result<TreeNodeRecursion> {
        Ok(TreeNodeRecursion::Continue)
    }

    fn with_new_children(
        self: Arc<Self>,
        mut children: Vec<Arc<dyn ExecutionPlan>>,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        let input = children
            .pop()
            .ok_or_else(|| DataFusionError::Internal("RejectsExec needs one child".into()))?;
        Ok(Arc::new(Self::try_new(Arc::clone(&self.sink), input)?))
    }

    fn execute(
        &self,
        partition: usize,
        context: Arc<TaskContext>,
    ) -> Result<SendableRecordBatchStream> {
        let input = self.input.execute(partition, context)?;
        let schema = self.input.schema();
        let keys = self
            .sink
            .keys()
            .iter()
            .map(|k| Ok((k.clone(), schema.index_of(k)?)))
            .collect::<Result<Vec<_>>>()?;
        Ok(Box::pin(RejectsStream {
            input,
            kind: schema.index_of(KIND_COL)?,
            seq: schema.index_of(SEQ_COL)?,
            schema,
            keys,
            sink: Arc::clone(&self.sink),
            rejected: MetricBuilder::new(&self.metrics).counter("rejected_rows", partition),
            output_rows: MetricBuilder::new(&self.metrics).output_rows(partition),
        }))
    }

    fn metrics(&self) -> Option<MetricsSet> {
        Some(self.metrics.clone_inner())
    }
}

/// One partition's events, the failing ones taken out.
struct RejectsStream {
    input: SendableRecordBatchStream,
    schema: SchemaRef,
    kind: usize,
    seq: usize,
    /// The key columns, by name and index.
    keys: Vec<(String, usize)>,
    sink: Arc<RejectSink>,
    rejected: Count,
    output_rows: Count,
}

/// Where `array` is NULL or, for a STRUCT, holds a NULL field at any depth.
fn null_anywhere(array: &dyn Array) -> Result<BooleanArray> {
    let mut nulls = is_null(array)?;
    if let Some(fields) = array.as_struct_opt() {
        for child in fields.columns() {
            nulls = or(&nulls, &null_anywhere(child.as_ref())?)?;
        }
    }
    Ok(nulls)
}

impl RejectsStream {
    fn divert(&self, batch: RecordBatch) -> Result<RecordBatch> {
        let mut rejected = null_anywhere(batch.column(self.seq).as_ref())?;
        self.sink.reject(&batch, &rejected, "NULL sequence")?;
        let kinds = batch
            .column(self.kind)
            .as_primitive_opt::<Int8Type>()
            .ok_or_else(|| DataFusionError::Internal(format!("{KIND_COL} is not Int8")))?;
        // the keys of truncate events are ignored (SPEC §2.2)
        let keyed = BooleanArray::from_unary(kinds, |k| k != Kind::Truncate as i8);
        for (name, index) in &self.keys {
            let column = batch.column(*index);
            if column.null_count() == 0 {
                continue;
            }
            let null_key = and(&and(&is_null(column.as_ref())?, &keyed)?, &not(&rejected)?)?;
            self.sink
                .reject(&batch, &null_key, &format!("NULL key column '{name}'"))?;
            rejected = or(&rejected, &null_key)?;
        }
        let count = rejected.true_count();
        if count == 0 {
            return Ok(batch);
        }
        self.rejected.add(count);
        Ok(filter_record_batch(&batch, &not(&rejected)?)?)
    }
}

impl Stream for RejectsStream {
    type Item = Result<RecordBatch>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        match self.input.poll_next_unpin(cx) {
            Poll::Ready(Some(Ok(batch))) => {
                let out = self.divert(batch);
                if let Ok(batch) = &out {
                    self.output_rows.add(batch.num_rows());
                }
                Poll::Ready(Some(out))
            }
            other => other,
        }
    }
}

impl RecordBatchStream for RejectsStream {
    fn schema(&self) -> SchemaRef {
        Arc::clone(&self.schema)
    }
}
