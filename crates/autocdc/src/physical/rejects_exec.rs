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
//! `STRUCT` sequence) is rejected for `NULL sequence`, one whose system
//! sequence (BITEMPORAL) is NULL for `NULL system sequence`; an UPSERT or DELETE
//! event with a NULL key column for `NULL key column 'k'`. Then, once the
//! partition's events are all in (its input is partitioned by key, so a
//! key's events are all here), events of one key and sequence (and system
//! sequence) that differ in kind or in a target column are rejected, every
//! one of them, for `conflicting events`; equal ones pass (the fold keeps
//! one). Below an SCD 2 or BITEMPORAL fold the input also holds the stored
//! events of the update's keys (`__cdc_origin`): only new events are
//! checked and rejected, and a new event that differs from the stored one of
//! its key and sequence is a conflict too: it goes, while new events equal
//! to the stored one are replays and pass (a DML-written event or an
//! erasure mark is no such stored event: the fold drops what it corrected). The others pass
//! on, in order. The rejected events go to the run's [`RejectSink`], which
//! its commit writes.
//!
//! | step        | per                     | cost                                        |
//! |-------------|-------------------------|---------------------------------------------|
//! | NULL checks | batch, as it arrives    | one null mask per key column and the sequence |
//! | conflicts   | partition, at its end   | the events buffered (under the memory pool), one row encoding of the key and sequence and of the values per batch, one hash table of (key, sequence) |
//! | conflicts, past the pool | identity, as it completes | the events sorted by key and sequence (DataFusion's sort, spilling; every partition then sorts), checked in order ([`super::sorted_conflicts`]) |
//!
//! Over truncate events and a snapshot's rows (`RejectsExec: flow=f, null
//! checks`) only the NULL checks apply (a truncate's keys are ignored; a
//! snapshot's duplicate keys are its diff's error: a key rejected there
//! would read as deleted), batch by batch.
//!
//! Like `ExpectationsExec`, the operator cannot travel to a cluster: its
//! sink lives in this process.

use std::collections::HashMap;
use std::fmt;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::task::{ready, Context, Poll};

use arrow::array::{Array, ArrayRef, AsArray, BooleanArray, RecordBatch};
use arrow::compute::kernels::boolean::{and, not, or};
use arrow::compute::{filter_record_batch, is_null};
use arrow::datatypes::{Int8Type, SchemaRef};
use arrow::row::{RowConverter, Rows, SortField};
use datafusion::common::tree_node::TreeNodeRecursion;
use datafusion::common::{DataFusionError, Result};
use datafusion::execution::memory_pool::{MemoryConsumer, MemoryReservation};
use datafusion::execution::{RecordBatchStream, SendableRecordBatchStream, TaskContext};
use datafusion::physical_expr::expressions::Column as PhysicalColumn;
use datafusion::physical_expr::{
    EquivalenceProperties, LexOrdering, PhysicalExpr, PhysicalSortExpr,
};
use datafusion::physical_plan::execution_plan::EmissionType;
use datafusion::physical_plan::metrics::{
    Count, ExecutionPlanMetricsSet, MetricBuilder, MetricsSet,
};
use datafusion::physical_plan::stream::RecordBatchStreamAdapter;
use datafusion::physical_plan::{
    DisplayAs, DisplayFormatType, ExecutionPlan, ExecutionPlanProperties, PlanProperties,
};
use datafusion::physical_plan::{Distribution, InputDistributionRequirements};
use futures::{Stream, StreamExt};

use super::conflict_rule::{of_origin, Identity, Origins};
use super::one_shot::{sort_retained_and_rest, sort_share};
use super::sorted_conflicts::{Checked, SortedConflicts};

use crate::fold::columns::{
    Kind, Origin, INTERNAL_PREFIX, KIND_COL, ORIGIN_COL, SEQ_COL, SYSTEM_SEQ_COL,
};
use crate::table::reject_sink::RejectSink;

/// Why the events of a conflict are rejected.
const CONFLICT: &str = "conflicting events (same key and sequence, different values)";

/// Rejects a flow's failing events (see the module docs).
#[derive(Debug)]
pub struct RejectsExec {
    sink: Arc<RejectSink>,
    /// Whether conflicts are rejected (key events); without, a streaming
    /// NULL check (truncate events).
    conflicts: bool,
    input: Arc<dyn ExecutionPlan>,
    properties: Arc<PlanProperties>,
    metrics: ExecutionPlanMetricsSet,
    /// Set by the first partition whose events the pool cannot hold: the
    /// others then sort theirs too, instead of holding memory the sorts
    /// need.
    sorting: Arc<AtomicBool>,
}

impl RejectsExec {
    /// Reject the failing events of `input` into `sink`.
    pub fn try_new(
        sink: Arc<RejectSink>,
        conflicts: bool,
        input: Arc<dyn ExecutionPlan>,
    ) -> Result<Self> {
        let schema = input.schema();
        schema.index_of(KIND_COL)?;
        schema.index_of(SEQ_COL)?;
        for key in sink.keys() {
            schema.index_of(key)?;
        }
        // checking conflicts, it emits once a partition's events are all in
        let emission = if conflicts {
            EmissionType::Final
        } else {
            input.pipeline_behavior()
        };
        // (checking conflicts, a partition whose events the pool cannot
        // hold sorts them: no order is kept)
        let equivalence = match conflicts {
            true => EquivalenceProperties::new(input.schema()),
            false => input.equivalence_properties().clone(),
        };
        let properties = Arc::new(PlanProperties::new(
            equivalence,
            input.output_partitioning().clone(),
            emission,
            input.boundedness(),
        ));
        Ok(Self {
            sink,
            conflicts,
            input,
            properties,
            metrics: ExecutionPlanMetricsSet::new(),
            sorting: Arc::new(AtomicBool::new(false)),
        })
    }
}

impl DisplayAs for RejectsExec {
    fn fmt_as(&self, t: DisplayFormatType, f: &mut fmt::Formatter) -> fmt::Result {
        match t {
            DisplayFormatType::Default | DisplayFormatType::Verbose => {
                write!(f, "RejectsExec: flow={}", self.sink.flow())?;
                if !self.conflicts {
                    write!(f, ", null checks")?;
                }
                Ok(())
            }
            DisplayFormatType::TreeRender => write!(f, "flow={}", self.sink.flow()),
        }
    }
}

impl RejectsExec {
    /// The key columns of the input, as expressions (its partitioning).
    fn key_exprs(&self) -> Result<Vec<Arc<dyn PhysicalExpr>>> {
        let schema = self.input.schema();
        self.sink
            .keys()
            .iter()
            .map(|k| Ok(Arc::new(PhysicalColumn::new_with_schema(k, &schema)?) as _))
            .collect()
    }
}

impl ExecutionPlan for RejectsExec {
    fn name(&self) -> &str {
        "RejectsExec"
    }

    fn input_distribution_requirements(&self) -> InputDistributionRequirements {
        if !self.conflicts {
            return InputDistributionRequirements::new(vec![Distribution::UnspecifiedDistribution]);
        }
        match self.key_exprs() {
            Ok(keys) if !keys.is_empty() => {
                InputDistributionRequirements::new(vec![Distribution::KeyPartitioned(keys)])
            }
            _ => InputDistributionRequirements::new(vec![Distribution::SinglePartition]),
        }
    }

    fn properties(&self) -> &Arc<PlanProperties> {
        &self.properties
    }

    fn children(&self) -> Vec<&Arc<dyn ExecutionPlan>> {
        vec![&self.input]
    }

    fn maintains_input_order(&self) -> Vec<bool> {
        vec![!self.conflicts]
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
        Ok(Arc::new(Self::try_new(
            Arc::clone(&self.sink),
            self.conflicts,
            input,
        )?))
    }

    fn execute(
        &self,
        partition: usize,
        context: Arc<TaskContext>,
    ) -> Result<SendableRecordBatchStream> {
        let schema = self.input.schema();
        let keys = self
            .sink
            .keys()
            .iter()
            .map(|k| Ok((k.clone(), schema.index_of(k)?)))
            .collect::<Result<Vec<_>>>()?;
        // the columns that make two events one (key, sequence) and those
        // whose values must then agree (SPEC §2.2)
        let seq = schema.index_of(SEQ_COL)?;
        let kind = schema.index_of(KIND_COL)?;
        let mut group: Vec<usize> = keys.iter().map(|(_, i)| *i).collect();
        group.push(seq);
        if let Ok(system) = schema.index_of(SYSTEM_SEQ_COL) {
            group.push(system);
        }
        let mut values: Vec<usize> = (0..schema.fields().len())
            .filter(|&i| !schema.field(i).name().starts_with(INTERNAL_PREFIX))
            .collect();
        values.push(kind);
        let origin = schema.index_of(ORIGIN_COL).ok();
        let reservation = MemoryConsumer::new(format!("RejectsExec[{partition}]"))
            .with_can_spill(true)
            .register(context.memory_pool());
        let input = self.input.execute(partition, Arc::clone(&context))?;
        let checks = NullChecks {
            kind,
            seq,
            system_seq: schema.index_of(SYSTEM_SEQ_COL).ok(),
            keys,
            origin,
            sink: Arc::clone(&self.sink),
            rejected: MetricBuilder::new(&self.metrics).counter("rejected_rows", partition),
        };
        Ok(Box::pin(RejectsStream {
            input,
            schema,
            group,
            values,
            checks,
            conflicts: self.conflicts,
            buffered: Vec::new(),
            reservation,
            output: None,
            sorted: None,
            context,
            partitions: self.properties.output_partitioning().partition_count(),
            sorting: Arc::clone(&self.sorting),
            output_rows: MetricBuilder::new(&self.metrics).output_rows(partition),
            fallbacks: MetricBuilder::new(&self.metrics).counter("num_sort_fallbacks", partition),
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
    /// The key and sequence columns: an event's identity.
    group: Vec<usize>,
    /// The target columns and the kind: what equal events agree on.
    values: Vec<usize>,
    /// The NULL checks, and the kind and origin columns.
    checks: NullChecks,
    /// Whether conflicts are checked (else each batch passes on at once).
    conflicts: bool,
    /// The partition's events so far, less those failing the NULL checks.
    buffered: Vec<RecordBatch>,
    reservation: MemoryReservation,
    /// The events to emit, once the input is done.
    output: Option<std::vec::IntoIter<RecordBatch>>,
    /// Once the pool refused to hold the events: all of them sorted by
    /// identity (spilling), checked as they come.
    sorted: Option<(SendableRecordBatchStream, SortedConflicts)>,
    context: Arc<TaskContext>,
    /// The operator's partitions (which share the pool's room for sorts).
    partitions: usize,
    /// Whether a partition sorts (see [`RejectsExec`]).
    sorting: Arc<AtomicBool>,
    output_rows: Count,
    fallbacks: Count,
}

/// The NULL checks of each batch (see the module docs).
#[derive(Clone)]
struct NullChecks {
    kind: usize,
    seq: usize,
    /// The system sequence (BITEMPORAL).
    system_seq: Option<usize>,
    /// The key columns, by name and index.
    keys: Vec<(String, usize)>,
    /// The origin column, when stored events come along.
    origin: Option<usize>,
    sink: Arc<RejectSink>,
    rejected: Count,
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

impl NullChecks {
    /// Where `batch`'s rows have `origin`.
    fn of_origin(&self, batch: &RecordBatch, origin: Origin) -> Result<BooleanArray> {
        of_origin(batch, self.origin, origin)
    }

    /// Take the new events failing the NULL checks out of `batch`.
    fn divert(&self, batch: RecordBatch) -> Result<RecordBatch> {
        let new = self.of_origin(&batch, Origin::New)?;
        let mut rejected = and(&null_anywhere(batch.column(self.seq).as_ref())?, &new)?;
        self.sink.reject(&batch, &rejected, "NULL sequence")?;
        if let Some(system) = self.system_seq {
            let column = batch.column(system);
            if column.null_count() > 0 {
                let null_system = and(&and(&is_null(column.as_ref())?, &new)?, &not(&rejected)?)?;
                self.sink
                    .reject(&batch, &null_system, "NULL system sequence")?;
                rejected = or(&rejected, &null_system)?;
            }
        }
        let kinds = batch
            .column(self.kind)
            .as_primitive_opt::<Int8Type>()
            .ok_or_else(|| DataFusionError::Internal(format!("{KIND_COL} is not Int8")))?;
        // the keys of truncate events are ignored (SPEC §2.2)
        let keyed = and(
            &BooleanArray::from_unary(kinds, |k| k != Kind::Truncate as i8),
            &new,
        )?;
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

impl RejectsStream {
    /// Keep `batch` (NULL checks done) until the input ends; `false` when
    /// the pool refused to hold it (it is kept all the same, for the sort).
    fn buffer(&mut self, batch: RecordBatch) -> bool {
        if batch.num_rows() == 0 {
            return true;
        }
        // in a bounded pool, a quarter of it for the partitions' events:
        // the fold above holds up to half while they pass on, and its
        // sorts need the rest
        let size = batch.get_array_memory_size();
        let cap = sort_share(&self.context, self.partitions) / 2;
        let held = !self.sorting.load(Ordering::Relaxed)
            && (cap == 0 || self.reservation.size() + size <= cap)
            && self.reservation.try_grow(size).is_ok();
        self.buffered.push(batch);
        held
    }

    /// The pool cannot hold the partition's events: sort them all by
    /// identity (spilling as the pool requires) and check them as they come
    /// ([`SortedConflicts`]).
    fn fall_back_to_sort(&mut self) -> Result<()> {
        let ordering = LexOrdering::new(self.group.iter().map(|&c| {
            PhysicalSortExpr::new_default(Arc::new(PhysicalColumn::new(
                self.schema.field(c).name(),
                c,
            )))
        }))
        .ok_or_else(|| DataFusionError::Internal("RejectsExec: no identity to sort by".into()))?;
        let checks = self.checks.clone();
        let rest = std::mem::replace(
            &mut self.input,
            Box::pin(RecordBatchStreamAdapter::new(
                Arc::clone(&self.schema),
                futures::stream::empty(),
            )),
        );
        let rest: SendableRecordBatchStream = Box::pin(RecordBatchStreamAdapter::new(
            Arc::clone(&self.schema),
            rest.map(move |batch| checks.divert(batch?)),
        ));
        let empty = self.reservation.new_empty();
        let reservation = std::mem::replace(&mut self.reservation, empty);
        // the sort holds the events from here: this partition keeps no more
        // than its share of the pool for it (the fold above sorts too)
        let share = sort_share(&self.context, self.partitions);
        if share > 0 && reservation.size() > share {
            reservation.shrink(reservation.size() - share);
        }
        let sorted = sort_retained_and_rest(
            std::mem::take(&mut self.buffered),
            rest,
            ordering,
            Arc::clone(&self.context),
            reservation,
            share,
        )?;
        let check = SortedConflicts::try_new(
            Arc::clone(&self.schema),
            self.group.clone(),
            self.values.clone(),
            self.checks.kind,
            self.checks.origin,
        )?;
        self.fallbacks.add(1);
        self.sorting.store(true, Ordering::Relaxed);
        self.sorted = Some((sorted, check));
        Ok(())
    }

    /// `checked` less its conflicting events (those go to the sink).
    fn without_checked_conflicts(&self, checked: Checked) -> Result<RecordBatch> {
        let Checked { batch, conflicting } = checked;
        let count = conflicting.true_count();
        if count > 0 {
            self.checks.sink.reject(&batch, &conflicting, CONFLICT)?;
            self.checks.rejected.add(count);
        }
        let batch = match count {
            0 => batch,
            _ => filter_record_batch(&batch, &not(&conflicting)?)?,
        };
        self.output_rows.add(batch.num_rows());
        Ok(batch)
    }

    /// The buffered events less every event of a conflict (those go to
    /// the sink).
    fn without_conflicts(&mut self) -> Result<Vec<RecordBatch>> {
        let batches = std::mem::take(&mut self.buffered);
        if batches.is_empty() {
            return Ok(batches);
        }
        let encode = |columns: &[usize]| -> Result<Vec<Rows>> {
            let fields = columns
                .iter()
                .map(|&c| SortField::new(self.schema.field(c).data_type().clone()))
                .collect();
            let converter = RowConverter::new(fields)?;
            batches
                .iter()
                .map(|b| {
                    let arrays: Vec<ArrayRef> =
                        columns.iter().map(|&c| Arc::clone(b.column(c))).collect();
                    Ok(converter.convert_columns(&arrays)?)
                })
                .collect()
        };
        let groups = encode(&self.group)?;
        let values = encode(&self.values)?;
        // each batch's new and stored events, once
        let origin = self.checks.origin;
        let origins = batches
            .iter()
            .map(|b| Origins::try_new(b, origin))
            .collect::<Result<Vec<_>>>()?;
        let counted = batches
            .iter()
            .zip(&origins)
            .map(|(b, origins)| origins.counted(b, self.checks.kind))
            .collect::<Result<Vec<_>>>()?;
        let mut seen: HashMap<&[u8], Identity<'_>> = HashMap::new();
        for (((g, v), counted), origins) in groups.iter().zip(&values).zip(&counted).zip(&origins) {
            for i in counted.values().set_indices() {
                seen.entry(g.row(i).data())
                    .or_default()
                    .count(v.row(i).data(), origins.met(i));
            }
        }
        if !seen.values().any(Identity::conflicts) {
            return Ok(batches);
        }
        let mut out = Vec::with_capacity(batches.len());
        for ((batch, (g, v)), origins) in
            batches.iter().zip(groups.iter().zip(&values)).zip(&origins)
        {
            let conflicting: BooleanArray = (0..g.num_rows())
                .map(|i| {
                    Some(
                        seen.get(g.row(i).data())
                            .is_some_and(|id| id.rejects(v.row(i).data())),
                    )
                })
                .collect();
            // stored events stay: only new ones are rejected
            let conflicting = and(&conflicting, &origins.new)?;
            let count = conflicting.true_count();
            if count == 0 {
                out.push(batch.clone());
                continue;
            }
            self.checks.sink.reject(batch, &conflicting, CONFLICT)?;
            self.checks.rejected.add(count);
            out.push(filter_record_batch(batch, &not(&conflicting)?)?);
        }
        Ok(out)
    }
}

impl Stream for RejectsStream {
    type Item = Result<RecordBatch>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        loop {
            if let Some(output) = &mut self.output {
                let next = output.next();
                if let Some(batch) = &next {
                    self.output_rows.add(batch.num_rows());
                } else {
                    self.reservation.free();
                }
                return Poll::Ready(next.map(Ok));
            }
            if let Some((sorted, check)) = &mut self.sorted {
                let checked = match ready!(sorted.poll_next_unpin(cx)) {
                    Some(Ok(batch)) => check.push(batch),
                    Some(Err(e)) => return Poll::Ready(Some(Err(e))),
                    None => {
                        let last = check.finish();
                        self.sorted = None;
                        self.output = Some(Vec::new().into_iter());
                        last
                    }
                };
                match checked {
                    Ok(Some(checked)) => {
                        return Poll::Ready(Some(self.without_checked_conflicts(checked)))
                    }
                    Ok(None) => continue,
                    Err(e) => return Poll::Ready(Some(Err(e))),
                }
            }
            match ready!(self.input.poll_next_unpin(cx)) {
                Some(Ok(batch)) if !self.conflicts => {
                    let out = self.checks.divert(batch);
                    if let Ok(batch) = &out {
                        self.output_rows.add(batch.num_rows());
                    }
                    return Poll::Ready(Some(out));
                }
                Some(Ok(batch)) => {
                    let held = match self.checks.divert(batch) {
                        Ok(batch) => self.buffer(batch),
                        Err(e) => return Poll::Ready(Some(Err(e))),
                    };
                    if !held {
                        if let Err(e) = self.fall_back_to_sort() {
                            return Poll::Ready(Some(Err(e)));
                        }
                    }
                }
                Some(Err(e)) => return Poll::Ready(Some(Err(e))),
                None => match self.without_conflicts() {
                    Ok(batches) => self.output = Some(batches.into_iter()),
                    Err(e) => return Poll::Ready(Some(Err(e))),
                },
            }
        }
    }
}

impl RecordBatchStream for RejectsStream {
    fn schema(&self) -> SchemaRef {
        Arc::clone(&self.schema)
    }
}
