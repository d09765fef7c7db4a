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
//!   rows of those keys, found when it runs by probing the key columns of
//!   the touched buckets' files and read by position
//!   ([`crate::table::superseded`]): the output goes to new files and those
//!   rows are marked in deletion vectors of the files that hold them
//!   ([`crate::table::deletion_vectors`]); nothing is rewritten;
//! * after a TRUNCATE, everything.
//!
//! The plan is the same whatever the events: its stage
//! ([`crate::table::stage`]) reads them once when the update runs and makes
//! the choice, which `TargetRowsExec` reads and the commit applies.

use std::ops::Not;

use chrono::{DateTime, Utc};
use std::sync::Arc;

use arrow::datatypes::{DataType, Field, Schema};
use datafusion::common::Column;
use datafusion::common::{DataFusionError, Result, ScalarValue};
use datafusion::datasource::{provider_as_source, MemTable};
use datafusion::execution::session_state::SessionState;
use datafusion::logical_expr::{
    cast, col, lit, when, Expr, ExprSchemable, Extension, LogicalPlan, LogicalPlanBuilder,
};

use crate::fold::columns::{
    Kind, Origin, END_AT_COL, INTERNAL_PREFIX, KIND_COL, ORIGIN_COL, SEQ_COL, START_AT_COL,
    STORED_DELETE_EVENT, STORED_DML_DELETE_EVENT, STORED_DML_UPSERT_EVENT, STORED_ERASED_AT,
    STORED_ERASED_THROUGH, STORED_UPSERT_EVENT, SYSTEM_END_AT_COL, SYSTEM_SEQ_COL,
    SYSTEM_START_AT_COL, UPDATE_LIST_COL, WRITTEN_AT_COL,
};
use crate::fold::snapshot_diff::{SIDE_COL, SIDE_LIVE, SIDE_SNAPSHOT};
use crate::fold::FoldSpec;
use crate::logical::{
    AutoCdcNode, CdcCommitNode, CdcWriteNode, ExpectationsNode, RejectsNode, SnapshotDiffNode,
    StagedEventsNode, StagedRole, WriteRequest,
};
use crate::physical::TargetRowsTable;
use crate::spec::expectations::{Expectation, ExpectationCounts};
use crate::spec::resolve::{
    check_change_feed_names, check_sequences_storable, plan_sql_expr, resolve, target_projection,
    update_list_type, written_at_type, written_at_value, ResolvedFlow,
};
use crate::spec::shared_target::check_tracked_alike;
use crate::spec::{ColumnSelection, FlowSpec, ScdType};
use crate::table::bucket::{bucket_field, BUCKET_COL, WATERMARK_BUCKET};
use crate::table::commit::{data_files, ChangeFeed, CommitRequest, MetadataChange, Replaces};
use crate::table::deletion_vectors::KeySet;
use crate::table::event::Operation;
use crate::table::plain_files::TableLocation;
use crate::table::properties::{
    checkpoint_app_id, last_version_property, FLOW_KEY_PREFIX, SNAPSHOT_WATERMARK_PROPERTY,
};
use crate::table::reject_sink::RejectSink;
use crate::table::rejects::takes_rejects;
use crate::table::stage::{find_in_buckets, Replacement, StageConfig, UpdateStage};
use crate::table::superseded::{Probing, Superseded};
use crate::table::{delta_err, ScdTable};

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

/// What an update is planned for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Planning {
    /// To run.
    Run,
    /// To be shown (`EXPLAIN` without `ANALYZE`): nothing is read. (A plan
    /// for a cluster, fitted to its events when planned to run, is shown
    /// reading and rewriting every bucket.)
    Explain,
}

use crate::spec::sequence_groups;

pub mod append;
pub mod checkpoint;
pub mod dependencies;
mod diff_views;
pub mod dml;
mod fits;
pub(crate) use fits::with_sequence_precision_checks;
pub(crate) use fits::DmlFitChecks;
pub(crate) mod failed_read;
pub(crate) mod folders;
pub mod source;
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
        late_through: None,
    }
}

/// The condition of expectation `e` over the columns `visible`: a BOOLEAN
/// judged row by row; else why not (a plan error, its message without
/// the expectation's name; a schema error for a column not there).
pub(crate) fn expectation_condition(
    state: &SessionState,
    e: &Expectation,
    visible: &datafusion::common::DFSchema,
) -> Result<Expr> {
    let condition = plan_sql_expr(state, &e.condition, &e.dialect, visible)?;
    match condition.get_type(visible)? {
        DataType::Boolean | DataType::Null => Ok(condition),
        t => Err(DataFusionError::Plan(format!(
            "the condition has type {t}, expected BOOLEAN"
        ))),
    }
}

/// An error's message without DataFusion's kind before it when it is a
/// plan error (the message then names what it is about).
pub(crate) fn plan_message(err: DataFusionError) -> String {
    match err {
        DataFusionError::Plan(message) => message,
        other => other.to_string(),
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
    // conditions name the rows' visible columns: planned against those
    // alone, a wrong name is told the columns a user has
    let visible = datafusion::common::DFSchema::from_unqualified_fields(
        rows.schema()
            .fields()
            .iter()
            .filter(|f| !f.name().starts_with(INTERNAL_PREFIX))
            .cloned()
            .collect(),
        Default::default(),
    )?;
    let conditions = expectations
        .iter()
        .map(|e| {
            expectation_condition(state, e, &visible).map_err(|err| {
                DataFusionError::Plan(format!(
                    "flow '{}': expectation '{}' ({}): {}",
                    flow.name,
                    e.name,
                    e.describe(),
                    plan_message(err)
                ))
            })
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
/// with it. Planning reads no data: what the update reads of the target is
/// chosen by its operators when it runs ([`crate::table::stage`]); only a
/// plan for a cluster (`autocdc.plain_parquet_reads`), which cannot carry
/// those operators, is fitted to its events when it is planned to run
/// (`planning`).
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
    // a full refresh's first update carries its clear: it folds its events
    // as into an empty table, forgets what the flows read, and its commit
    // removes every file (so a failure or crash before it leaves the table
    // as it was)
    let clearing = operation == Operation::FullRefresh;
    let meta = match clearing {
        true => table.meta().cleared(),
        false => table.meta(),
    };
    let now_micros = now.timestamp_micros();
    // SCD 2 and BITEMPORAL targets keep every event and derive their rows
    let scd2 = flow.stored_as_scd_type != ScdType::Type1;
    let bitemporal = flow.stored_as_scd_type == ScdType::Bitemporal;
    let plain_reads = crate::config::autocdc_options(state.config()).plain_parquet_reads;
    let stored_provider = if plain_reads {
        Arc::new(table.plain_files().await?) as Arc<dyn datafusion::catalog::TableProvider>
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
    // of DML) out of their updates; a snapshot's rows with a NULL key before
    // the diff
    let rejecting = !matches!(source, UpdateSource::Dml(_)) && takes_rejects(&meta.properties);
    let sink_for = |resolved: &ResolvedFlow| {
        let keys = resolved
            .layout
            .key_indices
            .iter()
            .map(|&k| resolved.layout.target_columns[k].clone())
            .collect();
        RejectSink::new(flow.name.clone(), keys)
    };
    let mut snapshot_rejects = None;
    // the snapshot watermark new events are late against (`fold::late`)
    let mut late_through = None;
    // `truncates`: whether the update has truncate events (snapshots never
    // truncate, nor flows without APPLY AS TRUNCATE)
    let (mut resolved, events, truncates, new_wins_ties) = match source {
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
            let source = fit_checked(flow, source, &meta)?;
            let resolved = resolve(state, flow, source, &meta.shape(), now_micros, None)?;
            check_sequences_storable(&flow.name, "SEQUENCE BY", &resolved)?;
            if !dml && flow.stored_as_scd_type == ScdType::Type2 {
                // the columns this update adds may be tracked by this flow
                // and not by the target's other flows, or the other way
                let columns: Vec<String> = resolved
                    .target_schema
                    .fields()
                    .iter()
                    .map(|f| f.name().clone())
                    .collect();
                check_tracked_alike(flow, meta.flows.values(), table.name(), &columns)?;
            }
            let mut events = resolved.events.clone();
            if dml {
                events = with_origin(events, Origin::Dml)?;
            }
            // change events not newer than the last snapshot are older than
            // an authoritative state: late (what DML writes is not; the fold
            // takes them out, `fold::late`)
            if let Some(watermark) = meta
                .properties
                .get(SNAPSHOT_WATERMARK_PROPERTY)
                .filter(|_| !dml)
            {
                // (refused now rather than when the fold runs)
                crate::stored_value::from_text(watermark, &resolved.sequence_type)?;
                late_through = Some(watermark.clone());
            }
            let truncates = flow.apply_as_truncates.is_some();
            (resolved, events, truncates, false)
        }
        UpdateSource::Snapshot { plan, version } => {
            let resolved = resolve(
                state,
                flow,
                fit_checked(flow, *plan, &meta)?,
                &meta.shape(),
                now_micros,
                Some(lit(version.clone())),
            )?;
            check_sequences_storable(&flow.name, "WITH VERSION", &resolved)?;
            // both sides are compared with strings as views (`diff_views`)
            let compared = diff_views::diff_schema(&resolved.target_schema);
            let target_columns = |side: i8| -> Vec<Expr> {
                let mut cols = if side == SIDE_LIVE {
                    stored_projection(&compared, &table.raw_provider().schema())
                } else {
                    target_projection(&compared)
                };
                cols.push(lit(side).alias(SIDE_COL));
                cols
            };
            let checked = match rejecting {
                true => {
                    let sink = Arc::new(sink_for(&resolved));
                    snapshot_rejects = Some(Arc::clone(&sink));
                    LogicalPlan::Extension(Extension {
                        node: Arc::new(RejectsNode::null_checks(sink, resolved.events.clone())),
                    })
                }
                false => diff_views::views_kept(resolved.events.clone())?,
            };
            let snapshot_rows = LogicalPlanBuilder::from(checked)
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
                let text = crate::stored_value::to_text(&version)?;
                extra_config.push((SNAPSHOT_WATERMARK_PROPERTY.to_string(), text.clone()));
                extra_config.push((last_version_property(&flow.name), text));
            }
            let diff = LogicalPlan::Extension(Extension {
                node: Arc::new(diff),
            });
            let diff = diff_views::stored_types(diff, &resolved.target_schema)?;
            (resolved, diff, false, true)
        }
    };
    check_change_feed_names(&flow.name, &resolved.layout.target_columns)?;
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
        // (the per-column fold takes each column from one event: a STRUCT
        // whose NULL fields keep the stored ones would need each field's)
        if resolved.layout.group_sequences {
            if let Some(ignored) = &flow.ignore_null_updates {
                let keeps = |c: &str| match ignored {
                    ColumnSelection::All => true,
                    ColumnSelection::Only(named) => named.iter().any(|n| n == c),
                    ColumnSelection::Except(named) => !named.iter().any(|n| n == c),
                };
                let nested = resolved.target_schema.fields().iter().find(|f| {
                    matches!(f.data_type(), arrow::datatypes::DataType::Struct(_))
                        && keeps(f.name())
                });
                if let Some(field) = nested {
                    return Err(DataFusionError::NotImplemented(format!(
                        "flow '{}': IGNORE NULL UPDATES: column '{}' is a STRUCT, and with \
                         per-column sequencing ('{}' of '{}') its NULL fields would not keep the \
                         stored ones; leave it out of IGNORE NULL UPDATES, keep its fields as \
                         columns of their own, or sequence the table by row",
                        flow.name,
                        field.name(),
                        sequence_groups::SEQUENCE_PER_COLUMN_PROPERTY,
                        table.name()
                    )));
                }
            }
        }
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
    // a target with stored rows folds only those its events need: the
    // update's stage reads the events once when it runs and chooses
    let stage =
        match meta.sequence_type.is_some() && !(plain_reads && planning == Planning::Explain) {
            true => {
                let options = crate::config::autocdc_options(state.config());
                Some(Arc::new(UpdateStage::new(StageConfig {
                    flow: flow.name.clone(),
                    table: Arc::clone(&table),
                    key_columns: resolved
                        .layout
                        .key_indices
                        .iter()
                        .map(|&i| resolved.layout.target_columns[i].clone())
                        .collect(),
                    buckets: meta.buckets,
                    rewrite_all: widened,
                    deletion_vector_keys: deletion_vector_budget(state, &table).await?,
                    compaction_limit: options.deletion_vector_max_files_per_bucket,
                    probing: Probing::of(state),
                })))
            }
            false => None,
        };
    let staged = |role: StagedRole, events: LogicalPlan| match &stage {
        Some(stage) => LogicalPlan::Extension(Extension {
            node: Arc::new(StagedEventsNode::new(Arc::clone(stage), role, events)),
        }),
        None => events,
    };
    // a plan for a cluster cannot carry its stage (it lives in this
    // process): the stage runs now and the plan is fitted to its choice
    let fitted = match (&stage, plain_reads) {
        (Some(stage), true) => Some(run_stage(state, stage, &events).await?),
        _ => None,
    };
    let (events, truncate_source) = match &fitted {
        Some((_, Some(staged))) => (staged.clone(), truncates.then(|| staged.clone())),
        // (a large update reads its source again)
        Some((_, None)) => (events.clone(), truncates.then_some(events)),
        None => (
            staged(StagedRole::Events, events.clone()),
            truncates.then(|| staged(StagedRole::Truncates, events)),
        ),
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
    let snapshot = snapshot_rejects.is_some();
    let rejects = match snapshot_rejects {
        Some(sink) => Some(sink),
        None => {
            rejecting.then(|| Arc::new(sink_for(&resolved).with_unreadable(unreadable.clone())))
        }
    };
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
    // (a snapshot's rows were checked before its diff)
    let new_rows = if scd2 || snapshot {
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
                    node: Arc::new(RejectsNode::null_checks(Arc::clone(sink), truncates)),
                }),
                None => truncates,
            };
            LogicalPlanBuilder::from(truncates)
                .project(vec![col(SEQ_COL), lit(Origin::New as i8).alias(ORIGIN_COL)])?
                .build()?
        }
    };

    let (event_plan, truncate_plan) = if meta.sequence_type.is_some() {
        let mut stored = stored_projection(&resolved.target_schema, &table.raw_provider().schema());
        stored.push(cast(col(SEQ_COL), seq_type.clone()).alias(SEQ_COL));
        // retention: tombstones (SCD 1) and erasure marks (SCD 2) older
        // than the threshold are gone, so a late event of their key applies
        let cutoff = lit(written_at_value(
            now_micros.saturating_sub(meta.tombstone_retention_secs.saturating_mul(1_000_000)),
        ));
        // SCD 1 folds its stored rows (live rows and tombstones); SCD 2 folds
        // its stored events, from which the versions are derived again, and
        // passes its erasure marks on. An SCD 2 version is also read as the
        // event it implies (`Origin::Implied`): the fold stores no hidden
        // copy of that event (BITEMPORAL versions imply none)
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
            let version = kind_is(Kind::Upsert);
            let origin = when(
                col(KIND_COL).gt_eq(lit(STORED_DML_UPSERT_EVENT)),
                lit(Origin::StoredByDml as i8),
            )
            .when(version.clone(), lit(Origin::Implied as i8))
            .otherwise(lit(Origin::Stored as i8))?;
            let live_marks = col(KIND_COL)
                .in_list(marks.iter().map(|&m| code(m)).collect(), false)
                .and(col(WRITTEN_AT_COL).gt_eq(cutoff));
            let mut read = col(KIND_COL)
                .in_list(events.iter().map(|&e| code(e)).collect(), false)
                .or(live_marks);
            if !bitemporal {
                read = read.or(version);
            }
            (kind.alias(KIND_COL), origin.alias(ORIGIN_COL), read)
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
        // the stored rows the update's stage chooses when it runs
        let raw_rows = match (&stage, &fitted) {
            (Some(_), Some((replacement, _))) => fitted_rows(&table, replacement, &raw_target)?,
            (Some(stage), None) => LogicalPlanBuilder::scan(
                TARGET_SCAN,
                provider_as_source(Arc::new(TargetRowsTable::new(
                    Arc::clone(stage),
                    Arc::clone(&table),
                ))),
                None,
            )?
            .build()?,
            (None, _) => raw_target()?,
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

    let mut fold_spec = fold_spec(state, flow, &resolved, new_wins_ties);
    fold_spec.late_through = late_through;
    let fold = AutoCdcNode::try_new(fold_spec, event_plan, truncate_plan)?;
    let fold = LogicalPlan::Extension(Extension {
        node: Arc::new(fold),
    });

    let delta = table.delta();
    let schema_needed = meta.sequence_type.is_none() || evolved;
    let mut metadata = Vec::new();
    if clearing {
        metadata.push(MetadataChange::forget_reads());
    }
    metadata.extend(meta.full_refresh_marks(&flow.name, clearing));
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
        replaces: stage.map_or(Replaces::All, Replaces::Staged),
        operation,
        started,
        expectations,
        update_id: crate::table::event::current_update_id(),
        newest_input_ms,
        rejects,
        clears: clearing,
    };
    // a target without rows can only gain rows: Delta readers derive those
    // inserts from the new files, no change file needed; the update
    // carrying a clear sees no stored row either (its commit works out
    // what changed, `CdcCommitExec`)
    let change_feed = if table.is_published() && (clearing || data_files(&delta).await?.is_empty())
    {
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

/// `source` with the checks of a declared target's narrower types
/// ([`fits`]).
fn fit_checked(
    flow: &FlowSpec,
    source: LogicalPlan,
    meta: &crate::table::TableMeta,
) -> Result<LogicalPlan> {
    let source = fits::with_sequence_precision_checks(flow, source)?;
    match meta.decl.declared_columns {
        true => fits::with_fit_checks(&flow.name, "COLUMNS", source, &meta.user_schema),
        false => Ok(source),
    }
}

/// The most events (Arrow bytes) a plan for a cluster carries; an update
/// with more has its executors read its source again.
const PLAN_EVENTS_MAX_BYTES: usize = 4 * 1024 * 1024;

/// Run `stage` over `events` while planning (a plan for a cluster): what
/// it chose, and its events as a table when it holds them all (`None`: a
/// large update, which reads its source again).
async fn run_stage(
    state: &SessionState,
    stage: &UpdateStage,
    events: &LogicalPlan,
) -> Result<(Replacement, Option<LogicalPlan>)> {
    stage.bind(state.create_physical_plan(events).await?);
    let staged = stage.staged(&state.task_ctx()).await?;
    let Some(batches) = staged.batches(0, 1) else {
        // (the running stream and what it pulled are let go)
        staged.let_go_of_rest();
        return Ok((staged.replacement.clone(), None));
    };
    // (a plan travels in one gRPC message, 16 MiB by Ballista's default:
    // more events than a few MiB are read again by the executors)
    let size: usize = batches
        .iter()
        .map(arrow::array::RecordBatch::get_array_memory_size)
        .sum();
    if size > PLAN_EVENTS_MAX_BYTES {
        return Ok((staged.replacement.clone(), None));
    }
    // declared nullable: a plan may say a column holds no NULL while its
    // batches do, and the staged table travels in plans that check
    let schema = Arc::new(Schema::new(
        events
            .schema()
            .fields()
            .iter()
            .map(|f| f.as_ref().clone().with_nullable(true))
            .collect::<Vec<_>>(),
    ));
    let batches = batches
        .into_iter()
        .map(|b| b.with_schema(Arc::clone(&schema)))
        .collect::<std::result::Result<Vec<_>, _>>()?;
    let partitions = state.config().target_partitions().max(1);
    let mut parts = vec![Vec::new(); partitions];
    for (i, batch) in batches.into_iter().enumerate() {
        parts[i % partitions].push(batch);
    }
    let table = MemTable::try_new(schema, parts)?;
    let plan = LogicalPlanBuilder::scan("__cdc_events", provider_as_source(Arc::new(table)), None)?
        .build()?;
    Ok((staged.replacement.clone(), Some(plan)))
}

/// The stored rows `replacement` chose, as plain Parquet scans (a plan
/// for a cluster); `raw_target` scans them all.
fn fitted_rows(
    table: &ScdTable,
    replacement: &Replacement,
    raw_target: &dyn Fn() -> Result<LogicalPlan>,
) -> Result<LogicalPlan> {
    let in_buckets = |buckets: &[i32]| -> Result<LogicalPlan> {
        LogicalPlanBuilder::from(raw_target()?)
            .filter(col(BUCKET_COL).in_list(buckets.iter().map(|b| lit(*b)).collect(), false))?
            .build()
    };
    match (&replacement.superseded, &replacement.touched) {
        (Some(superseded), _) => {
            let delta = table.delta();
            let rows = superseded.plain_provider(TableLocation {
                url: delta.table_url(),
                store: delta.object_store(),
                schema: table.raw_provider().schema(),
                partition_columns: &table.partition_columns()?,
            })?;
            let rows =
                LogicalPlanBuilder::scan(TARGET_SCAN, provider_as_source(rows), None)?.build()?;
            if replacement.compacted.is_empty() {
                return Ok(rows);
            }
            LogicalPlanBuilder::from(rows)
                .union(in_buckets(&replacement.compacted)?)?
                .build()
        }
        (None, Some(touched)) => in_buckets(touched),
        (None, None) => raw_target(),
    }
}

/// The stored rows of `keys` in the data files of the buckets `touched`.
pub(crate) async fn find_superseded(
    state: &SessionState,
    table: &ScdTable,
    keys: Arc<KeySet>,
    touched: &[i32],
) -> Result<Superseded> {
    find_in_buckets(table, keys, touched, &Probing::of(state)).await
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
        compression: table.meta().compression,
        key_indices,
        change_feed,
    }
}

/// The run number of the next run of `flow` into `table` (its checkpoint
/// moves to it with the run's commit).
pub(crate) async fn next_run(table: &ScdTable, flow: &str) -> Result<i64> {
    let last = table.last_run(&checkpoint_app_id(flow)).await?;
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
