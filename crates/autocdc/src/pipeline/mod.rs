//! Updates: planning one run of a flow and committing its result.
//!
//! ```text
//!  source ─► project events ─┬─ UPSERT/DELETE ─┐
//!                            │                 ├─ ∪ stored rows ─► AutoCdc ─► CdcWrite ─► CdcCommit
//!                            └─ TRUNCATE seqs ─┴─ ∪ stored watermark ─┘
//! ```
//! The stored state of the target takes part in every update (SCD 1 keeps
//! one row per key), so an update may re-read its whole source: replays are
//! dropped as late by the fold.
//!
//! What an update reads and replaces of the target:
//! * by default, the key buckets its events touch: their stored rows are
//!   folded with the events and the buckets' files replaced by the output;
//! * when its distinct keys are few (`autocdc.deletion_vector_max_fraction`
//!   of the live rows) and the table takes deletion vectors, only the stored
//!   rows of those keys, found while planning by probing the key columns of
//!   the touched buckets' files and read by position
//!   ([`crate::table::superseded`]): the output goes to new files and those
//!   rows are marked in deletion vectors of the files that hold them
//!   ([`crate::table::deletion_vectors`]); nothing is rewritten;
//! * after a TRUNCATE, everything.

use std::ops::Not;

use chrono::{DateTime, Utc};
use std::sync::Arc;

use arrow::array::{AsArray, RecordBatch};
use arrow::datatypes::{DataType, Field, Int32Type, Schema};
use datafusion::common::Column;
use datafusion::common::{DataFusionError, Result, ScalarValue};
use datafusion::dataframe::DataFrame;
use datafusion::datasource::{provider_as_source, MemTable};
use datafusion::execution::session_state::SessionState;
use datafusion::logical_expr::{
    cast, col, lit, when, Expr, ExprSchemable, Extension, LogicalPlan, LogicalPlanBuilder,
    ScalarUDF,
};
use futures::StreamExt;

use crate::fold::columns::{
    Kind, Origin, END_AT_COL, KIND_COL, ORIGIN_COL, SEQ_COL, START_AT_COL, STORED_DELETE_EVENT,
    STORED_DML_DELETE_EVENT, STORED_DML_UPSERT_EVENT, STORED_ERASED_AT, STORED_ERASED_THROUGH,
    STORED_UPSERT_EVENT, SYSTEM_END_AT_COL, SYSTEM_SEQ_COL, SYSTEM_START_AT_COL, UPDATE_LIST_COL,
    WRITTEN_AT_COL,
};
use crate::fold::snapshot_diff::{SIDE_COL, SIDE_LIVE, SIDE_SNAPSHOT};
use crate::fold::FoldSpec;
use crate::logical::{
    AutoCdcNode, CdcCommitNode, CdcWriteNode, ExpectationsNode, RejectsNode, SnapshotDiffNode,
    WriteRequest,
};
use crate::spec::expectations::{Expectation, ExpectationCounts};
use crate::spec::resolve::{
    plan_sql_expr, resolve, target_projection, update_list_type, written_at_type, written_at_value,
    ResolvedFlow,
};
use crate::spec::{FlowSpec, ScdType};
use crate::table::bucket::{bucket_field, BucketUdf, BUCKET_COL, WATERMARK_BUCKET};
use crate::table::commit::{bucket_of, data_files, ChangeFeed, CommitRequest, MetadataChange};
use crate::table::deletion_vectors::KeySet;
use crate::table::event::Operation;
use crate::table::plain_files::{PlainFilesTable, TableLocation};
use crate::table::properties::{
    checkpoint_app_id, last_version_property, FLOW_KEY_PREFIX, SNAPSHOT_WATERMARK_PROPERTY,
};
use crate::table::reject_sink::RejectSink;
use crate::table::rejects::takes_rejects;
use crate::table::superseded::Superseded;
use crate::table::{delta_err, ScdTable};
use staged::{stage_events, StagedEvents};

/// A sequence value as table-property text (read back with
/// [`ScalarValue::try_from_string`]).
pub fn scalar_to_text(value: &ScalarValue) -> Result<String> {
    let text = value.cast_to(&arrow::datatypes::DataType::Utf8)?;
    match text {
        ScalarValue::Utf8(Some(s)) => Ok(s),
        other => Err(DataFusionError::Internal(format!(
            "cannot store version {other} as text"
        ))),
    }
}

/// Most keys an update retires with deletion vectors (they are held in memory).
const MAX_DELETION_VECTOR_KEYS: usize = 10_000_000;

/// Name of the stored target in update plans.
const TARGET_SCAN: &str = "__cdc_target";

/// Where the new events of an update come from.
#[derive(Debug)]
pub enum UpdateSource {
    /// The flow's change feed, read whole.
    Changes,
    /// A DML statement's edited histories ([`dml`]): for each key, the
    /// events its history becomes (SCD 2), or one DELETE erasing it.
    Dml(Box<LogicalPlan>),
    /// A snapshot (planned by the caller) at `version`.
    Snapshot {
        /// The snapshot rows.
        plan: Box<LogicalPlan>,
        /// Its version: the sequence of the events it produces.
        version: ScalarValue,
    },
}

/// How far planning an update may look at its data.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Planning {
    /// Fit the plan to the update's events: planning runs them to find the
    /// key buckets they touch and whether they are few enough for deletion
    /// vectors (a snapshot's diff runs for the same reason).
    Adaptive,
    /// Read no data (`EXPLAIN` without `ANALYZE`): the plan of an update that
    /// reads and rewrites every bucket. A snapshot version that was not
    /// evaluated (a NULL version) is recorded nowhere.
    ReadNothing,
}

use crate::spec::sequence_groups;

pub mod append;
pub mod checkpoint;
pub mod dependencies;
pub mod dml;
pub mod source;
pub mod staged;
pub mod started;
pub(crate) mod streams;

/// The target columns of stored rows, each cast to its type; columns the
/// stored files do not have yet (added by this update) are NULL.
fn stored_projection(target_schema: &Schema, stored: &Schema) -> Vec<Expr> {
    target_schema
        .fields()
        .iter()
        .map(|f| {
            let value = if stored.field_with_name(f.name()).is_ok() {
                col(Column::new_unqualified(f.name()))
            } else {
                lit(ScalarValue::Null)
            };
            cast(value, f.data_type().clone()).alias(f.name())
        })
        .collect()
}

/// `events` followed by a NULL sequence column per name of `columns` (the
/// group sequences of per-column sequencing: new events have none).
fn with_group_sequences(
    events: LogicalPlan,
    columns: &[String],
    seq_type: &DataType,
) -> Result<LogicalPlan> {
    if columns.is_empty() {
        return Ok(events);
    }
    let mut projection: Vec<Expr> = events
        .schema()
        .columns()
        .into_iter()
        .map(Expr::Column)
        .collect();
    projection.extend(
        columns
            .iter()
            .map(|c| cast(lit(ScalarValue::Null), seq_type.clone()).alias(c)),
    );
    LogicalPlanBuilder::from(events)
        .project(projection)?
        .build()
}

/// `events` with every row's origin set to `origin`.
fn with_origin(events: LogicalPlan, origin: Origin) -> Result<LogicalPlan> {
    let projection: Vec<Expr> = events
        .schema()
        .columns()
        .into_iter()
        .map(|c| {
            if c.name == ORIGIN_COL {
                lit(origin as i8).alias(ORIGIN_COL)
            } else {
                Expr::Column(c)
            }
        })
        .collect();
    LogicalPlanBuilder::from(events)
        .project(projection)?
        .build()
}

/// How `flow`'s resolved events fold, under the session's fold options.
pub(crate) fn fold_spec(
    state: &SessionState,
    flow: &FlowSpec,
    resolved: &ResolvedFlow,
    new_wins_ties: bool,
) -> FoldSpec {
    let options = crate::config::autocdc_options(state.config());
    FoldSpec {
        flow: flow.name.clone(),
        layout: resolved.layout.clone(),
        stored_as: flow.stored_as_scd_type,
        tracked: resolved.tracked.clone(),
        new_wins_ties,
        partial: resolved.partial.clone(),
        indexed_fold: options.indexed_fold,
        indexed_fold_max_bytes: options.indexed_fold_max_bytes,
        visible_only: false,
    }
}

/// `rows` (a flow's events) under the check of the target's
/// `expectations`, and the counts the check keeps.
pub(crate) fn check_expectations(
    state: &SessionState,
    flow: &FlowSpec,
    expectations: &[Expectation],
    rows: LogicalPlan,
    rejects: Option<Arc<RejectSink>>,
) -> Result<(LogicalPlan, Arc<ExpectationCounts>)> {
    let schema = Arc::clone(rows.schema());
    let conditions = expectations
        .iter()
        .map(|e| {
            let clause = |m: String| {
                DataFusionError::Plan(format!(
                    "flow '{}': expectation '{}' ({}): {m}",
                    flow.name,
                    e.name,
                    e.describe()
                ))
            };
            let condition = plan_sql_expr(state, &e.condition, &e.dialect, &schema)
                .map_err(|err| clause(err.to_string()))?;
            match condition.get_type(schema.as_ref()) {
                Ok(DataType::Boolean | DataType::Null) => Ok(condition),
                Ok(t) => Err(clause(format!(
                    "the condition has type {t}, expected BOOLEAN"
                ))),
                Err(err) => Err(clause(err.to_string())),
            }
        })
        .collect::<Result<Vec<_>>>()?;
    let counts = Arc::new(ExpectationCounts::new(expectations.to_vec()));
    let node = ExpectationsNode::new(flow.name.clone(), conditions, Arc::clone(&counts), rows)
        .with_rejects(rejects);
    Ok((
        LogicalPlan::Extension(Extension {
            node: Arc::new(node),
        }),
        counts,
    ))
}

/// Plan one run of `flow` into `table`:
/// `CdcCommit(CdcWrite(AutoCdc(events, truncates)))`.
/// `operation` is what the run is for the event log; the first run
/// ([`Operation::CreateFlow`]) writes the flow definition into the table
/// with it; `planning` says whether planning may read the update's data.
pub async fn plan_update(
    state: &SessionState,
    table: Arc<ScdTable>,
    flow: &FlowSpec,
    operation: Operation,
    now: DateTime<Utc>,
    source: UpdateSource,
    planning: Planning,
) -> Result<LogicalPlan> {
    let started = std::time::Instant::now();
    let register = operation == Operation::CreateFlow;
    let meta = table.meta();
    let now_micros = now.timestamp_micros();
    // SCD 2 and BITEMPORAL targets keep every event and derive their rows
    let scd2 = flow.stored_as_scd_type != ScdType::Type1;
    let bitemporal = flow.stored_as_scd_type == ScdType::Bitemporal;
    let plain_reads = crate::config::autocdc_options(state.config()).plain_parquet_reads;
    let stored_provider = if plain_reads {
        Arc::new(plain_files(&table).await?) as Arc<dyn datafusion::catalog::TableProvider>
    } else {
        table.raw_provider()
    };
    let raw_target = || -> Result<LogicalPlan> {
        LogicalPlanBuilder::scan(
            TARGET_SCAN,
            provider_as_source(Arc::clone(&stored_provider)),
            None,
        )?
        .build()
    };
    let mut extra_config: Vec<(String, String)> = Vec::new();
    // when the newest of what this update reads arrived (the event log)
    let mut newest_input_ms = None;
    // lines of the source it could not read (rejects on: they are rejects)
    let mut unreadable = None;
    // the target's expectations check what a flow brings (not DML, and
    // snapshot flows take none)
    let expected = matches!(source, UpdateSource::Changes) && !meta.decl.expectations.is_empty();
    // a target with rejects on takes the failing events of its flows (not
    // of DML, nor of snapshots) out of their updates
    let rejecting = matches!(source, UpdateSource::Changes) && takes_rejects(&meta.properties);
    // `truncate_source`: what the truncate events are read from (`None`: the
    // update has none — snapshots never truncate, nor flows without
    // APPLY AS TRUNCATE — and the costly events stay out of that input)
    let (mut resolved, events, touched, truncate_source, new_wins_ties) = match source {
        UpdateSource::Changes | UpdateSource::Dml(_) => {
            let dml = matches!(source, UpdateSource::Dml(_));
            let source = match source {
                UpdateSource::Dml(plan) => *plan,
                _ => {
                    let read = source::plan_changes(state, flow, &meta)
                        .await
                        .map_err(|e| source::in_from_clause(&flow.name, e))?;
                    extra_config.extend(read.checkpoint);
                    newest_input_ms = read.newest_input_ms;
                    unreadable = read.unreadable;
                    read.plan
                }
            };
            let resolved = resolve(state, flow, source, &meta.shape(), now_micros, None)?;
            let mut events = resolved.events.clone();
            if dml {
                events = with_origin(events, Origin::Dml)?;
            }
            // change events not newer than the last snapshot are older than
            // an authoritative state and dropped (what DML writes is not)
            if let Some(watermark) = meta
                .properties
                .get(SNAPSHOT_WATERMARK_PROPERTY)
                .filter(|_| !dml)
            {
                let watermark =
                    ScalarValue::try_from_string(watermark.clone(), &resolved.sequence_type)?;
                let mut newer = col(SEQ_COL).gt(lit(watermark));
                if flow.apply_as_truncates.is_some() {
                    newer = newer.or(col(KIND_COL).eq(lit(Kind::Truncate as i8)));
                }
                events = LogicalPlanBuilder::from(events).filter(newer)?.build()?;
            }
            let truncates = flow.apply_as_truncates.is_some();
            // the source is read once, here; the plan reads what was staged
            let (staged, touched, truncate_source) = match planning {
                Planning::Adaptive => {
                    match stage_events(state, &flow.name, &resolved.layout, &events, meta.buckets)
                        .await?
                    {
                        StagedEvents::Small {
                            events: staged,
                            touched,
                        } => {
                            let truncate_source = truncates.then(|| staged.clone());
                            (staged, touched, truncate_source)
                        }
                        // a plan for a cluster reads the source again: a
                        // run started here cannot travel
                        StagedEvents::Large { .. } if plain_reads => {
                            (events.clone(), None, truncates.then(|| events.clone()))
                        }
                        // a resumed run is read once: the truncate events
                        // (if any) are read from the source again
                        StagedEvents::Large { events: staged } => {
                            (staged, None, truncates.then(|| events.clone()))
                        }
                    }
                }
                Planning::ReadNothing => (events.clone(), None, truncates.then_some(events)),
            };
            (resolved, staged, touched, truncate_source, false)
        }
        UpdateSource::Snapshot { plan, version } => {
            let resolved = resolve(
                state,
                flow,
                *plan,
                &meta.shape(),
                now_micros,
                Some(lit(version.clone())),
            )?;
            let target_columns = |side: i8| -> Vec<Expr> {
                let mut cols = if side == SIDE_LIVE {
                    stored_projection(&resolved.target_schema, &table.raw_provider().schema())
                } else {
                    target_projection(&resolved.target_schema)
                };
                cols.push(lit(side).alias(SIDE_COL));
                cols
            };
            let snapshot_rows = LogicalPlanBuilder::from(resolved.events.clone())
                .project(target_columns(SIDE_SNAPSHOT))?
                .build()?;
            let tagged = if meta.sequence_type.is_some() {
                let mut live = col(KIND_COL).eq(lit(Kind::Upsert as i8));
                if scd2 {
                    live = live.and(col(END_AT_COL).is_null());
                }
                let live_rows = LogicalPlanBuilder::from(raw_target()?)
                    .filter(live)?
                    .project(target_columns(SIDE_LIVE))?
                    .build()?;
                LogicalPlanBuilder::from(live_rows)
                    .union(snapshot_rows)?
                    .build()?
            } else {
                snapshot_rows
            };
            let diff = SnapshotDiffNode::try_new(
                flow.name.clone(),
                resolved.layout.key_indices.clone(),
                version.clone(),
                written_at_value(now_micros),
                tagged,
            )?;
            if !version.is_null() {
                let text = scalar_to_text(&version)?;
                extra_config.push((SNAPSHOT_WATERMARK_PROPERTY.to_string(), text.clone()));
                extra_config.push((last_version_property(&flow.name), text));
            }
            let diff = LogicalPlan::Extension(Extension {
                node: Arc::new(diff),
            });
            // a diff of few keys is kept in memory and applied like a small
            // change feed (deletion vectors); a large one is streamed into a
            // rewrite of every bucket (from the run started here, if any)
            let planned = match planning {
                Planning::Adaptive => small_diff(state, &table, &flow.name, &diff).await?,
                Planning::ReadNothing => PlannedDiff::NotRun,
            };
            let (events, touched) = match planned {
                PlannedDiff::Small(changes) => {
                    let touched = touched_buckets(state, &resolved, &changes, meta.buckets).await?;
                    (changes, touched)
                }
                // (a plan for a cluster diffs again: a run started here
                // cannot travel)
                PlannedDiff::Large(_) if plain_reads => (diff, None),
                PlannedDiff::Large(changes) => (changes, None),
                PlannedDiff::NotRun => (diff, None),
            };
            (resolved, events, touched, None, true)
        }
    };
    let seq_type = resolved.sequence_type.clone();
    // per-column sequencing (SPEC §2.6): SCD 1 keeps each group's sequence
    // in its state; SCD 2 folds every event in sequence order anyway and
    // only writes groups whole
    if let Some(declared) = sequence_groups::declared(&table.name().to_string(), &meta.properties)?
    {
        if bitemporal {
            return Err(DataFusionError::Plan(format!(
                "flow '{}': per-column sequencing ('{}' of '{}') is not allowed with BITEMPORAL",
                flow.name,
                sequence_groups::SEQUENCE_PER_COLUMN_PROPERTY,
                table.name()
            )));
        }
        resolved.layout.sequence_groups = sequence_groups::resolve(
            &flow.name,
            &declared,
            &resolved.layout.target_columns,
            &resolved.layout.key_indices,
        )?;
        resolved.layout.group_sequences = !scd2 && !resolved.layout.sequence_groups.is_empty();
    }
    let group_columns: Vec<String> = if resolved.layout.group_sequences {
        resolved
            .layout
            .sequence_groups
            .iter()
            .map(|g| g.state_column())
            .collect()
    } else {
        Vec::new()
    };
    // schema evolution (SPEC §2.9): new columns are NULL in stored rows; a
    // widened column is rewritten in every file, so that every reader sees
    // one type per column (no Delta type widening feature needed)
    let evolved = meta.sequence_type.is_some()
        && resolved.target_schema.fields() != meta.user_schema.fields();
    let widened = meta.user_schema.fields().iter().any(|old| {
        resolved
            .target_schema
            .field_with_name(old.name())
            .is_ok_and(|new| new.data_type() != old.data_type())
    });
    let touched = if widened { None } else { touched };
    // a small update of a large table retires the stored rows of its keys
    // with deletion vectors instead of rewriting whole buckets
    // (and compacts the fullest of them: `compacted` are read and rewritten
    // whole)
    let (superseded, compacted) = match &touched {
        Some(buckets) if meta.sequence_type.is_some() => {
            match superseded_keys(state, &table, &resolved, &events).await? {
                Some(keys) => {
                    let compacted = buckets_to_compact(state, &table, buckets).await?;
                    let probed: Vec<i32> = buckets
                        .iter()
                        .filter(|b| !compacted.contains(b))
                        .copied()
                        .collect();
                    let superseded = find_superseded(state, &table, keys, &probed)
                        .await
                        .map_err(|e| {
                            e.context(format!(
                                "flow '{}': finding the stored rows of the update's keys in '{}'",
                                flow.name,
                                table.name()
                            ))
                        })?;
                    (Some(Arc::new(superseded)), compacted)
                }
                None => (None, Vec::new()),
            }
        }
        _ => (None, Vec::new()),
    };

    let kind_is = |k: Kind| col(KIND_COL).eq(lit(k as i8));
    // only a flow with APPLY AS TRUNCATE has truncate events (and a
    // truncate source): no filter otherwise, which the optimizer would
    // keep as one that is always true
    let new_rows = match truncate_source {
        Some(_) => LogicalPlanBuilder::from(events.clone())
            .filter(kind_is(Kind::Truncate).not())?
            .build()?,
        None => events.clone(),
    };
    let rejects = rejecting.then(|| {
        let keys = resolved
            .layout
            .key_indices
            .iter()
            .map(|&k| resolved.layout.target_columns[k].clone())
            .collect();
        Arc::new(RejectSink::new(flow.name.clone(), keys).with_unreadable(unreadable.clone()))
    });
    let (new_rows, expectations) = if expected {
        let (rows, counts) = check_expectations(
            state,
            flow,
            &meta.decl.expectations,
            new_rows,
            rejects.clone(),
        )?;
        (rows, Some(counts))
    } else {
        (new_rows, None)
    };
    // SCD 1 keeps no events: its new events are checked alone; SCD 2 and
    // BITEMPORAL check theirs against the stored events they fold with
    // (SPEC §2.2), below
    let rejecting_new = |rows: LogicalPlan| match &rejects {
        Some(sink) => LogicalPlan::Extension(Extension {
            node: Arc::new(RejectsNode::new(Arc::clone(sink), rows)),
        }),
        None => rows,
    };
    let new_rows = if scd2 {
        new_rows
    } else {
        rejecting_new(new_rows)
    };
    let new_truncates = match truncate_source {
        None => LogicalPlanBuilder::empty(false)
            .project(vec![
                cast(lit(ScalarValue::Null), seq_type.clone()).alias(SEQ_COL),
                lit(Origin::New as i8).alias(ORIGIN_COL),
            ])?
            .build()?,
        Some(source) => {
            let truncates = LogicalPlanBuilder::from(source)
                .filter(kind_is(Kind::Truncate))?
                .build()?;
            // a truncate with a NULL sequence is rejected like any event
            let truncates = match &rejects {
                Some(sink) => LogicalPlan::Extension(Extension {
                    node: Arc::new(RejectsNode::truncates(Arc::clone(sink), truncates)),
                }),
                None => truncates,
            };
            LogicalPlanBuilder::from(truncates)
                .project(vec![col(SEQ_COL), lit(Origin::New as i8).alias(ORIGIN_COL)])?
                .build()?
        }
    };

    let (event_plan, truncate_plan) = if meta.sequence_type.is_some() {
        let raw = raw_target()?;
        // read only the buckets this update touches
        let raw = match &touched {
            Some(buckets) => LogicalPlanBuilder::from(raw)
                .filter(col(BUCKET_COL).in_list(buckets.iter().map(|b| lit(*b)).collect(), false))?
                .build()?,
            None => raw,
        };
        let mut stored = stored_projection(&resolved.target_schema, &table.raw_provider().schema());
        stored.push(cast(col(SEQ_COL), seq_type.clone()).alias(SEQ_COL));
        // retention: tombstones (SCD 1) and erasure marks (SCD 2) older
        // than the threshold are gone, so a late event of their key applies
        let cutoff = lit(written_at_value(
            now_micros.saturating_sub(meta.tombstone_retention_secs.saturating_mul(1_000_000)),
        ));
        // SCD 1 folds its stored rows (live rows and tombstones); SCD 2 folds
        // its stored events, from which the versions are derived again, and
        // passes its erasure marks on
        let (stored_kind, stored_origin, stored_filter) = if scd2 {
            let code = |c: i8| lit(c);
            let events = [
                STORED_UPSERT_EVENT,
                STORED_DELETE_EVENT,
                STORED_DML_UPSERT_EVENT,
                STORED_DML_DELETE_EVENT,
            ];
            let marks = [STORED_ERASED_AT, STORED_ERASED_THROUGH];
            let kind = when(
                col(KIND_COL).in_list(
                    vec![code(STORED_UPSERT_EVENT), code(STORED_DML_UPSERT_EVENT)],
                    false,
                ),
                lit(Kind::Upsert as i8),
            )
            .when(
                col(KIND_COL).in_list(
                    vec![code(STORED_DELETE_EVENT), code(STORED_DML_DELETE_EVENT)],
                    false,
                ),
                lit(Kind::Delete as i8),
            )
            .otherwise(col(KIND_COL))?;
            let origin = when(
                col(KIND_COL).gt_eq(lit(STORED_DML_UPSERT_EVENT)),
                lit(Origin::StoredByDml as i8),
            )
            .otherwise(lit(Origin::Stored as i8))?;
            let live_marks = col(KIND_COL)
                .in_list(marks.iter().map(|&m| code(m)).collect(), false)
                .and(col(WRITTEN_AT_COL).gt_eq(cutoff));
            (
                kind.alias(KIND_COL),
                origin.alias(ORIGIN_COL),
                col(KIND_COL)
                    .in_list(events.iter().map(|&e| code(e)).collect(), false)
                    .or(live_marks),
            )
        } else {
            let expired = kind_is(Kind::Delete).and(col(WRITTEN_AT_COL).lt(cutoff));
            (
                col(KIND_COL),
                lit(Origin::Stored as i8).alias(ORIGIN_COL),
                kind_is(Kind::Truncate).not().and(expired.not()),
            )
        };
        stored.push(stored_kind);
        stored.push(cast(col(WRITTEN_AT_COL), written_at_type()).alias(WRITTEN_AT_COL));
        stored.push(stored_origin);
        if let Some(system_type) = &resolved.system_sequence_type {
            stored.push(cast(col(SYSTEM_SEQ_COL), system_type.clone()).alias(SYSTEM_SEQ_COL));
        }
        if resolved.layout.update_list {
            // SCD 1 stores merged rows (a NULL list writes every column);
            // SCD 2 stores each event's list
            let list = if scd2 {
                col(UPDATE_LIST_COL)
            } else {
                lit(ScalarValue::Null)
            };
            stored.push(cast(list, update_list_type()).alias(UPDATE_LIST_COL));
        }
        // each group's sequence (NULL where the files do not have it yet:
        // never written)
        let stored_schema = table.raw_provider().schema();
        for name in &group_columns {
            let value = if stored_schema.field_with_name(name).is_ok() {
                col(Column::new_unqualified(name))
            } else {
                lit(ScalarValue::Null)
            };
            stored.push(cast(value, seq_type.clone()).alias(name));
        }
        // with deletion vectors, only the stored rows of the update's keys
        let raw_rows = match &superseded {
            Some(superseded) if plain_reads => {
                let delta = table.delta();
                let rows = superseded.plain_provider(TableLocation {
                    url: delta.table_url(),
                    store: delta.object_store(),
                    schema: table.raw_provider().schema(),
                    partition_columns: &table.partition_columns()?,
                })?;
                LogicalPlanBuilder::scan(TARGET_SCAN, provider_as_source(rows), None)?.build()?
            }
            Some(superseded) => {
                let rows = superseded.provider(
                    &table.delta().object_store(),
                    table.raw_provider().schema(),
                    state.config().target_partitions(),
                )?;
                LogicalPlanBuilder::scan(TARGET_SCAN, provider_as_source(rows), None)?.build()?
            }
            None => raw,
        };
        // the buckets compacted by this update are read whole
        let raw_rows = if compacted.is_empty() {
            raw_rows
        } else {
            let whole = LogicalPlanBuilder::from(raw_target()?)
                .filter(
                    col(BUCKET_COL).in_list(compacted.iter().map(|b| lit(*b)).collect(), false),
                )?
                .build()?;
            LogicalPlanBuilder::from(raw_rows).union(whole)?.build()?
        };
        let stored_rows = LogicalPlanBuilder::from(raw_rows)
            .filter(stored_filter)?
            .project(stored)?
            .build()?;
        // the watermark row lives in its own bucket: read only that one
        // (a small update would otherwise read the kind column of every
        // file of the buckets it touches)
        let stored_watermark = LogicalPlanBuilder::from(raw_target()?)
            .filter(
                col(BUCKET_COL)
                    .eq(lit(WATERMARK_BUCKET))
                    .and(kind_is(Kind::Truncate)),
            )?
            .project(vec![
                cast(col(SEQ_COL), seq_type.clone()).alias(SEQ_COL),
                // (it keeps older new events out, removes no stored row)
                lit(Origin::Stored as i8).alias(ORIGIN_COL),
            ])?
            .build()?;
        let new_rows = with_group_sequences(new_rows, &group_columns, &seq_type)?;
        let events = LogicalPlanBuilder::from(new_rows)
            .union(stored_rows)?
            .build()?;
        (
            if scd2 { rejecting_new(events) } else { events },
            LogicalPlanBuilder::from(new_truncates)
                .union(stored_watermark)?
                .build()?,
        )
    } else if scd2 {
        (rejecting_new(new_rows), new_truncates)
    } else {
        (
            with_group_sequences(new_rows, &group_columns, &seq_type)?,
            new_truncates,
        )
    };

    let fold_spec = fold_spec(state, flow, &resolved, new_wins_ties);
    let fold = AutoCdcNode::try_new(fold_spec, event_plan, truncate_plan)?;
    let fold = LogicalPlan::Extension(Extension {
        node: Arc::new(fold),
    });

    let delta = table.delta();
    let schema_needed = meta.sequence_type.is_none() || evolved;
    let mut metadata = Vec::new();
    if schema_needed {
        let mut fields: Vec<Field> = resolved
            .target_schema
            .fields()
            .iter()
            .map(|f| f.as_ref().clone())
            .collect();
        if scd2 {
            fields.push(Field::new(START_AT_COL, seq_type.clone(), true));
            fields.push(Field::new(END_AT_COL, seq_type.clone(), true));
        }
        if let (true, Some(system_type)) = (bitemporal, &resolved.system_sequence_type) {
            fields.push(Field::new(SYSTEM_START_AT_COL, system_type.clone(), true));
            fields.push(Field::new(SYSTEM_END_AT_COL, system_type.clone(), true));
        }
        fields.push(Field::new(SEQ_COL, seq_type.clone(), true));
        fields.push(Field::new(
            KIND_COL,
            arrow::datatypes::DataType::Int8,
            false,
        ));
        fields.push(Field::new(WRITTEN_AT_COL, written_at_type(), true));
        if let (true, Some(system_type)) = (bitemporal, &resolved.system_sequence_type) {
            fields.push(Field::new(SYSTEM_SEQ_COL, system_type.clone(), true));
        }
        if scd2 && resolved.layout.update_list {
            fields.push(Field::new(UPDATE_LIST_COL, update_list_type(), true));
        }
        for name in &group_columns {
            fields.push(Field::new(name, seq_type.clone(), true));
        }
        fields.push(bucket_field());
        metadata.push(MetadataChange::Schema(Arc::new(Schema::new(fields))));
    }
    metadata.extend(
        extra_config
            .into_iter()
            .map(|(key, value)| MetadataChange::Set(key, value)),
    );
    if register {
        let json = serde_json::to_string(flow).map_err(delta_err)?;
        metadata.push(MetadataChange::Set(
            format!("{FLOW_KEY_PREFIX}{}", flow.name),
            json,
        ));
    }
    let request = CommitRequest {
        target: table.name().clone(),
        table: Arc::clone(&table),
        flow: flow.clone(),
        metadata,
        run: next_run(&table, &flow.name).await?,
        touched,
        superseded,
        compacted,
        operation,
        started,
        expectations,
        update_id: crate::table::event::current_update_id(),
        newest_input_ms,
        rejects,
    };
    // a target without rows can only gain rows: Delta readers derive those
    // inserts from the new files, no change file needed
    let change_feed = if table.is_published() && data_files(&delta).await?.is_empty() {
        ChangeFeed::FromAdds
    } else {
        ChangeFeed::Files
    };
    let write = write_request(
        &table,
        &flow.name,
        resolved.layout.key_indices.clone(),
        change_feed,
    );
    let write = LogicalPlan::Extension(Extension {
        node: Arc::new(CdcWriteNode::try_new(Arc::new(write), fold)?),
    });
    let commit = CdcCommitNode::try_new(Arc::new(request), write)?;
    Ok(LogicalPlan::Extension(Extension {
        node: Arc::new(commit),
    }))
}

/// The distinct keys of an update's events when it should retire their
/// stored rows with deletion vectors: the table takes them, the session
/// allows them (`autocdc.deletion_vectors`), and the keys are at most
/// `autocdc.deletion_vector_max_fraction` of the live stored rows (beyond
/// that, rewriting the touched buckets costs less).
async fn superseded_keys(
    state: &SessionState,
    table: &ScdTable,
    resolved: &ResolvedFlow,
    events: &LogicalPlan,
) -> Result<Option<Arc<KeySet>>> {
    let Some(max_keys) = deletion_vector_budget(state, table).await? else {
        return Ok(None);
    };
    let names: Vec<String> = resolved
        .layout
        .key_indices
        .iter()
        .map(|&i| resolved.layout.target_columns[i].clone())
        .collect();
    let plan = LogicalPlanBuilder::from(events.clone())
        .project(
            names
                .iter()
                .map(|n| Expr::Column(Column::new_unqualified(n))),
        )?
        .distinct()?
        .limit(0, Some(max_keys + 1))?
        .build()?;
    let batches = DataFrame::new(state.clone(), plan).collect().await?;
    let count: usize = batches.iter().map(RecordBatch::num_rows).sum();
    if count == 0 || count > max_keys {
        return Ok(None);
    }
    Ok(Some(Arc::new(KeySet::try_new(names, &batches)?)))
}

/// The stored rows of `table` as plain Parquet scans
/// (`autocdc.plain_parquet_reads`).
pub(crate) async fn plain_files(table: &ScdTable) -> Result<PlainFilesTable> {
    let delta = table.delta();
    PlainFilesTable::with_vectors(
        TableLocation {
            url: delta.table_url(),
            store: delta.object_store(),
            schema: table.raw_provider().schema(),
            partition_columns: &table.partition_columns()?,
        },
        data_files(&delta).await?,
    )
}

/// The stored rows of `keys` in the data files of the buckets `touched`.
pub(crate) async fn find_superseded(
    state: &SessionState,
    table: &ScdTable,
    keys: Arc<KeySet>,
    touched: &[i32],
) -> Result<Superseded> {
    let delta = table.delta();
    let views = data_files(&delta)
        .await?
        .into_iter()
        .filter(|v| bucket_of(v).is_some_and(|b| b != WATERMARK_BUCKET && touched.contains(&b)))
        .collect();
    Superseded::find(
        &delta.object_store(),
        keys,
        views,
        state.config().target_partitions(),
    )
    .await
}

/// Run a snapshot's `diff` while planning when the update could use
/// deletion vectors: its change events in memory when there are few enough
/// for them (see [`superseded_keys`]); otherwise the same run, resumed by
/// the update's rewrite ([`started::resume_stream`]), so the diff runs once.
async fn small_diff(
    state: &SessionState,
    table: &ScdTable,
    flow: &str,
    diff: &LogicalPlan,
) -> Result<PlannedDiff> {
    if table.meta().sequence_type.is_none() {
        return Ok(PlannedDiff::NotRun);
    }
    let Some(max_rows) = deletion_vector_budget(state, table).await? else {
        return Ok(PlannedDiff::NotRun);
    };
    let mut stream = DataFrame::new(state.clone(), diff.clone())
        .execute_stream()
        .await?;
    let (mut pulled, mut rows) = (Vec::new(), 0);
    while rows <= max_rows {
        match stream.next().await {
            Some(batch) => {
                let batch = batch?;
                rows += batch.num_rows();
                pulled.push(batch);
            }
            None => break,
        }
    }
    let (name, provider): (&str, Arc<dyn datafusion::catalog::TableProvider>) = if rows > max_rows {
        // too many for vectors: the rewrite reads the rest of this run
        (
            "__cdc_snapshot_diff",
            started::resume_stream(
                format!("flow '{flow}': the snapshot diff started while planning"),
                pulled,
                stream,
            )?,
        )
    } else {
        let changes = MemTable::try_new(Arc::clone(diff.schema().inner()), vec![pulled])?;
        ("__cdc_snapshot_changes", Arc::new(changes))
    };
    let plan = LogicalPlanBuilder::scan(name, provider_as_source(provider), None)?.build()?;
    Ok(if rows > max_rows {
        PlannedDiff::Large(plan)
    } else {
        PlannedDiff::Small(plan)
    })
}

/// What running a snapshot's diff while planning gave.
enum PlannedDiff {
    /// Not run: the update cannot use deletion vectors.
    NotRun,
    /// Few enough changes for deletion vectors, in memory.
    Small(LogicalPlan),
    /// Too many: the changes pulled and the rest of the same run.
    Large(LogicalPlan),
}

/// Where and how a run of `flow` writes into `table`: rows bucketed by the
/// columns at `key_indices`.
pub(crate) fn write_request(
    table: &ScdTable,
    flow: &str,
    key_indices: Vec<usize>,
    change_feed: ChangeFeed,
) -> WriteRequest {
    let delta = table.delta();
    WriteRequest {
        target: table.name().clone(),
        flow: flow.to_string(),
        location: delta.table_url().clone(),
        buckets: table.meta().buckets,
        key_indices,
        change_feed,
    }
}

/// The run number of the next run of `flow` into `table` (its checkpoint
/// moves to it with the run's commit).
pub(crate) async fn next_run(table: &ScdTable, flow: &str) -> Result<i64> {
    let delta = table.delta();
    let last = delta
        .snapshot()
        .map_err(delta_err)?
        .transaction_version(delta.log_store().as_ref(), checkpoint_app_id(flow))
        .await
        .map_err(delta_err)?;
    Ok(last.unwrap_or(0) + 1)
}

/// How many keys an update of `table` may touch and still retire their
/// stored rows with deletion vectors: `autocdc.deletion_vector_max_fraction`
/// of the live stored rows. `None` when the session or the table does not
/// take deletion vectors or the table is (nearly) empty.
pub(crate) async fn deletion_vector_budget(
    state: &SessionState,
    table: &ScdTable,
) -> Result<Option<usize>> {
    let options = crate::config::autocdc_options(state.config());
    let delta = table.delta();
    if !options.deletion_vectors
        || !delta
            .snapshot()
            .is_ok_and(crate::table::takes_deletion_vectors)
    {
        return Ok(None);
    }
    let files = data_files(&delta).await?;
    let live: i64 = files
        .iter()
        .map(|v| {
            v.num_records().unwrap_or(0) as i64
                - v.deletion_vector_descriptor()
                    .map_or(0, |dv| dv.cardinality)
        })
        .sum();
    let max_keys = (live as f64 * options.deletion_vector_max_fraction).floor();
    if max_keys < 1.0 {
        return Ok(None);
    }
    // (bounded: the keys are held in memory)
    Ok(Some(max_keys.min(MAX_DELETION_VECTOR_KEYS as f64) as usize))
}

/// The buckets among `touched` that an update using deletion vectors
/// rewrites whole, compacting each into one file without the rows its
/// vectors deleted. Each such update adds a file to every bucket it
/// touches; with `limit` = `autocdc.deletion_vector_max_files_per_bucket`
/// (0: never compact), it also compacts the ⌈touched ÷ limit⌉ fullest
/// touched buckets holding more than limit ÷ 2 files (ties: lower bucket
/// first). Updates that touch every bucket so keep about `limit` files per
/// bucket, and each pays for a few buckets' rewrite instead of one update
/// in `limit` rewriting them all at once (a latency spike).
async fn buckets_to_compact(
    state: &SessionState,
    table: &ScdTable,
    touched: &[i32],
) -> Result<Vec<i32>> {
    let limit = crate::config::autocdc_options(state.config()).deletion_vector_max_files_per_bucket;
    if limit == 0 || touched.is_empty() {
        return Ok(Vec::new());
    }
    let mut files: datafusion::common::HashMap<i32, usize> = Default::default();
    for bucket in data_files(&table.delta())
        .await?
        .iter()
        .filter_map(bucket_of)
    {
        if touched.contains(&bucket) {
            *files.entry(bucket).or_default() += 1;
        }
    }
    Ok(compaction_choice(
        files.into_iter().collect(),
        touched.len(),
        limit,
    ))
}

/// Which buckets to compact, given the data files of each touched bucket
/// (`files`), how many buckets are touched and the file limit (see
/// [`buckets_to_compact`]); sorted by bucket.
fn compaction_choice(mut files: Vec<(i32, usize)>, touched: usize, limit: usize) -> Vec<i32> {
    files.retain(|&(_, n)| n > limit / 2);
    files.sort_unstable_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
    let mut chosen: Vec<i32> = files
        .into_iter()
        .take(touched.div_ceil(limit))
        .map(|(bucket, _)| bucket)
        .collect();
    chosen.sort_unstable();
    chosen
}

/// The key buckets an update's new events fall in; `None` when it must
/// rewrite every bucket (a TRUNCATE touches all keys).
async fn touched_buckets(
    state: &SessionState,
    resolved: &ResolvedFlow,
    events: &LogicalPlan,
    buckets: i32,
) -> Result<Option<Vec<i32>>> {
    const ALL: i32 = -2;
    let udf = ScalarUDF::new_from_impl(BucketUdf::new(buckets));
    let keys: Vec<Expr> = resolved
        .layout
        .key_indices
        .iter()
        .map(|&i| Expr::Column(Column::new_unqualified(&resolved.layout.target_columns[i])))
        .collect();
    let bucket =
        when(col(KIND_COL).eq(lit(Kind::Truncate as i8)), lit(ALL)).otherwise(udf.call(keys))?;
    let plan = LogicalPlanBuilder::from(events.clone())
        .project(vec![bucket.alias(BUCKET_COL)])?
        .distinct()?
        .build()?;
    let batches = DataFrame::new(state.clone(), plan).collect().await?;
    let mut touched: Vec<i32> = batches
        .iter()
        .flat_map(|b| {
            b.column(0)
                .as_primitive::<Int32Type>()
                .iter()
                .flatten()
                .collect::<Vec<_>>()
        })
        .collect();
    if touched.contains(&ALL) {
        return Ok(None);
    }
    touched.sort_unstable();
    Ok(Some(touched))
}

#[cfg(test)]
mod tests {
    use super::compaction_choice;

    #[test]
    fn compaction_takes_the_fullest_touched_buckets_past_half_the_limit() {
        // 16 touched buckets, limit 8: two a time, the fullest first
        let files: Vec<(i32, usize)> = (0..16).map(|b| (b, 5 + (b as usize % 3))).collect();
        assert_eq!(compaction_choice(files, 16, 8), vec![2, 5]);
        // none past half the limit: none
        assert_eq!(
            compaction_choice(vec![(0, 4), (1, 3)], 2, 8),
            Vec::<i32>::new()
        );
        // one bucket touched: it alone, once past half the limit
        assert_eq!(compaction_choice(vec![(7, 5)], 1, 8), vec![7]);
        // ties go to the lower bucket
        assert_eq!(compaction_choice(vec![(3, 3), (1, 3)], 2, 2), vec![1]);
    }

    #[test]
    fn updates_touching_every_bucket_keep_about_limit_files_per_bucket() {
        // a simulation of the rule: each update adds a file to every bucket
        // and compacts the chosen ones into one file
        let (buckets, limit) = (16usize, 8usize);
        let mut files = vec![1usize; buckets];
        let mut most = 0;
        for _ in 0..200 {
            let chosen = compaction_choice(
                files
                    .iter()
                    .enumerate()
                    .map(|(b, &n)| (b as i32, n))
                    .collect(),
                buckets,
                limit,
            );
            assert!(chosen.len() <= 2);
            for (b, n) in files.iter_mut().enumerate() {
                *n = if chosen.contains(&(b as i32)) {
                    1
                } else {
                    *n + 1
                };
            }
            most = most.max(*files.iter().max().unwrap_or(&0));
        }
        assert!(most <= 2 * limit, "{most}");
    }
}
