//! Incremental sources: what a flow has read of its source is checkpointed
//! in the target, in the same commit as the data, so the next update reads
//! only what is new.
//!
//! ```text
//!  FROM t                                    read at this update
//!  ├─ streaming table (Delta) ──► versions (checkpoint, latest] of its change
//!  │                              data feed: inserted and updated rows
//!  ├─ listing table (Parquet,  ─► files not in the checkpoint
//!  │  CSV, JSON folder)
//!  └─ anything else ───────────► everything (replays are harmless)
//!
//!  FROM STREAM t / STREAM(t) / stream(t), t a streaming table (SPEC §4.3)
//!  ├─ no option ───────────────► rows added by the new versions; a version
//!  │                              that updated or deleted rows fails the read
//!  ├─ skipChangeCommits ───────► the same, such versions skipped whole
//!  └─ readChangeFeed ──────────► the change feed of the new versions (at
//!                                 the first read: the snapshot as inserts of
//!                                 its version), with _change_type,
//!                                 _commit_version, _commit_timestamp
//!  WITH (startingVersion = n): the first read takes the versions from n on
//!  instead of the snapshot; a table dropped and created again since the
//!  checkpoint fails the read
//!
//!  FROM (query): its streams read the same way ([`super::streams`]), each
//!  checkpointed; a query without streams is read whole
//! ```
//!
//! The first update of a flow (and every update after `REFRESH ... FULL`)
//! reads the whole source (a streaming table: its current snapshot). A changed row of a streaming table read by `FROM
//! t` arrives as its post-image; rows that did not change are not read again,
//! and re-reading them would be a replay anyway, so the target is the same as
//! with whole reads. Whether a version updated or deleted rows is read from
//! its change feed (`_change_type` other than `insert`).

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use arrow::datatypes::DataType;
use datafusion::catalog::TableProvider;
use datafusion::common::{Column, DataFusionError, Result, ScalarValue, TableReference};
use datafusion::datasource::listing::ListingTable;
use datafusion::datasource::provider_as_source;
use datafusion::execution::session_state::SessionState;
use datafusion::logical_expr::{cast, col, lit, Expr, LogicalPlan, LogicalPlanBuilder};
use futures::{StreamExt, TryStreamExt};
use object_store::{ObjectMeta, ObjectStore, ObjectStoreExt};

use super::checkpoint::SourceCheckpoint;
use super::folders::new_files;
use super::streams::{self, CHANGES_SCAN};
use crate::functions::debezium::{
    list_event_files, readable_end, DebeziumTable, EventFile, FileNames, FlowUse,
};
use crate::spec::resolve::plan_source;
use crate::spec::{FlowSource, FlowSpec, StreamRead};
use crate::table::changes::changes_provider;
use crate::table::meta::TableMeta;
use crate::table::properties::source_checkpoint_property;
use crate::table::reject_sink::UnreadableLines;
use crate::table::rejects::takes_rejects;
use crate::table::ScdTable;

/// The new part of a flow's source and the checkpoint that records it.
#[derive(Debug)]
pub struct SourceRead {
    /// Plan of the source rows to read at this update.
    pub plan: LogicalPlan,
    /// Checkpoint to commit with the update (`None`: the source is re-read
    /// whole every time).
    pub checkpoint: Option<(String, String)>,
    /// When the newest of what it reads arrived, in milliseconds since the
    /// epoch: the newest new file's modification time, or the commit time of
    /// the newest upstream version (`None`: unknown, or nothing new).
    pub newest_input_ms: Option<i64>,
    /// Lines of the source that could not be read, for the run's rejects
    /// (a Debezium source of a target with rejects on).
    pub unreadable: Option<Arc<UnreadableLines>>,
}

/// An error reading a flow's source, as the flow's `FROM` clause's.
pub(crate) fn in_from_clause(flow: &str, e: DataFusionError) -> DataFusionError {
    let message = match e {
        DataFusionError::Plan(message) => message,
        e => e.to_string(),
    };
    DataFusionError::Plan(format!("flow '{flow}': FROM: {message}"))
}

/// Plan the part of `flow`'s source that this update reads.
pub async fn plan_changes(
    state: &SessionState,
    flow: &FlowSpec,
    target: &TableMeta,
) -> Result<SourceRead> {
    let whole = || async { plan_source(state, &flow.source, &flow.dialect).await };
    let key = source_checkpoint_property(&flow.name);
    let encode = |c: &SourceCheckpoint| {
        serde_json::to_string(c).map_err(|e| DataFusionError::External(Box::new(e)))
    };
    let previous: Option<SourceCheckpoint> = target
        .properties
        .get(&key)
        .and_then(|json| serde_json::from_str(json).ok());
    if let FlowSource::Query(query) = &flow.source {
        return Ok(
            match streams::plan_query(state, query, &flow.dialect, previous).await? {
                Some(read) => SourceRead {
                    plan: read.plan,
                    checkpoint: Some((key, encode(&read.checkpoint)?)),
                    newest_input_ms: read.newest_input_ms,
                    unreadable: None,
                },
                None => SourceRead {
                    plan: whole().await?,
                    checkpoint: None,
                    newest_input_ms: None,
                    unreadable: None,
                },
            },
        );
    }
    if let FlowSource::Debezium { path } = &flow.source {
        return debezium_changes(state, flow, path, previous, key, target).await;
    }
    let FlowSource::Table(name) = &flow.source else {
        return Ok(SourceRead {
            plan: whole().await?,
            checkpoint: None,
            newest_input_ms: None,
            unreadable: None,
        });
    };
    let reference = TableReference::parse_str(name);
    let provider = match state.schema_for_ref(reference.clone()) {
        Ok(schema) => schema.table(reference.table()).await?,
        Err(_) => None,
    };
    let Some(provider) = provider else {
        // let the planner report the unknown table
        return Ok(SourceRead {
            plan: whole().await?,
            checkpoint: None,
            newest_input_ms: None,
            unreadable: None,
        });
    };

    if let Some(table) = provider.downcast_ref::<ScdTable>() {
        // (the lookup brought it to its latest version: the session's
        // schemas and a registered warehouse's refresh streaming tables)
        let delta = table.delta();
        let version = delta.version().unwrap_or(0);
        let table_id = table.delta_table_id();
        let checkpoint = SourceCheckpoint::Delta {
            table_id: table_id.clone(),
            version,
        };
        let since = match previous {
            Some(SourceCheckpoint::Delta {
                table_id: read_id,
                version: read,
            }) => Some(super::streams::same_table(
                name, &read_id, read, &table_id, version,
            )?),
            _ => None,
        };
        // the first commit to read; `None`: a new stream starts at the
        // table's current snapshot (SPEC §4.3)
        let first = match (since, flow.starting_version) {
            (Some(read), _) => Some(read + 1),
            (None, Some(starting)) => {
                Some(super::streams::check_starting(name, starting, version)?)
            }
            (None, None) => None,
        };
        let pinned = || {
            LogicalPlanBuilder::scan(
                reference.clone(),
                provider_as_source(Arc::new(table.pinned())),
                None,
            )
        };
        let plan = match (flow.stream, first) {
            // the snapshot as inserts at its version, as its change feed
            // would have them
            (StreamRead::ChangeFeed, None) => {
                let at = table.commit_time(version).await?.unwrap_or(0);
                let schema = changes_provider(table, version, Some(version))?.schema();
                snapshot_as_changes(pinned()?.build()?, &schema, version, at)?
            }
            // each commit's changes once (but those a restore undid)
            (StreamRead::ChangeFeed, Some(from)) => {
                let changes = changes_provider(table, from.min(version), None)?;
                if from > version {
                    empty_with(changes.schema())?
                } else {
                    let undone = streams::restored_away(table, from, version).await?;
                    let scan =
                        LogicalPlanBuilder::scan(CHANGES_SCAN, provider_as_source(changes), None)?
                            .filter(not_in_versions(&undone))?;
                    if flow.post_images_only {
                        scan.filter(col("_change_type").not_eq(lit("update_preimage")))?
                            .build()?
                    } else {
                        scan.build()?
                    }
                }
            }
            // the version the checkpoint records, whatever later lookups load
            (_, None) => pinned()?.build()?,
            (_, Some(from)) if from > version => empty_with(provider.schema())?,
            (StreamRead::Rows, Some(from)) => {
                let undone = streams::restored_away(table, from, version).await?;
                changed_rows(table, from, &provider, &undone)?
            }
            (mode, Some(from)) => {
                appended_rows(state, table, from, &provider, mode, name, version).await?
            }
        };
        let newest_input_ms = match first {
            Some(from) if from > version => None,
            _ => table.commit_time(version).await?,
        };
        return Ok(SourceRead {
            plan,
            checkpoint: Some((key, encode(&checkpoint)?)),
            newest_input_ms,
            unreadable: None,
        });
    }

    if flow.stream == StreamRead::ChangeFeed {
        return Err(DataFusionError::Plan(format!(
            "{}: '{name}' is not a streaming table, and only streaming tables have a change feed",
            flow.stream.describe(name)
        )));
    }

    if let Some(listing) = provider.downcast_ref::<ListingTable>() {
        if !listing.options().table_partition_cols.is_empty() {
            return Ok(SourceRead {
                plan: whole().await?,
                checkpoint: None,
                newest_input_ms: None,
                unreadable: None,
            });
        }
        let read = match previous {
            Some(SourceCheckpoint::Files { files }) => files,
            _ => BTreeSet::new(),
        };
        let new = new_files(state, listing, &read).await?;
        let plan = match new.newest_ms {
            None => empty_with(provider.schema())?,
            Some(_) => {
                LogicalPlanBuilder::scan(reference.table(), provider_as_source(new.provider), None)?
                    .build()?
            }
        };
        let checkpoint = SourceCheckpoint::Files { files: new.read };
        let newest_input_ms = new.newest_ms;
        return Ok(SourceRead {
            plan,
            checkpoint: Some((key, encode(&checkpoint)?)),
            newest_input_ms,
            unreadable: None,
        });
    }

    Ok(SourceRead {
        plan: whole().await?,
        checkpoint: None,
        newest_input_ms: None,
        unreadable: None,
    })
}

/// How many event files' ends are looked at at once.
const ENDS_READ_AT_ONCE: usize = 16;

/// A flow `FROM debezium('path')`: the event files not read yet (all at the
/// first update), their primary-key changes made DELETEs of the old keys.
async fn debezium_changes(
    state: &SessionState,
    flow: &FlowSpec,
    path: &str,
    previous: Option<SourceCheckpoint>,
    key: String,
    target: &TableMeta,
) -> Result<SourceRead> {
    let (store, files) = list_event_files(state.runtime_env(), path).await?;
    // how much of each file was read (a checkpoint of the files alone, of
    // an earlier version: each whole, as it was then)
    let read: BTreeMap<String, u64> = match previous {
        Some(SourceCheckpoint::EventFiles { files }) => files,
        Some(SourceCheckpoint::Files { files }) => {
            files.into_iter().map(|f| (f, u64::MAX)).collect()
        }
        _ => BTreeMap::new(),
    };
    let parts: Vec<(ObjectMeta, u64)> = files
        .iter()
        .map(|meta| {
            let done = read.get(meta.location.as_ref()).copied().unwrap_or(0);
            (meta.clone(), done)
        })
        .collect();
    let names = FileNames::new(path)?;
    let ends = futures::stream::iter(parts)
        .map(|(meta, done)| {
            let name = names.of(&meta.location);
            part_to_read(Arc::clone(&store), meta, done, name)
        })
        .buffered(ENDS_READ_AT_ONCE)
        .try_collect::<Vec<_>>()
        .await
        .map_err(|e| e.context(format!("flow '{}': debezium('{path}')", flow.name)))?;
    let mut old = Vec::new();
    let mut new = Vec::new();
    // (a file read before stays read while it is away from the folder: one
    // moved out and back is read on from where it was read)
    let mut checkpoint = read;
    for (meta, (done, end)) in files.into_iter().zip(ends) {
        if end > 0 {
            checkpoint.insert(meta.location.to_string(), end);
        }
        if end > done {
            new.push(EventFile {
                meta: ObjectMeta { size: end, ..meta },
                start: done,
            });
        } else if done > 0 {
            // (its events read before, up to where they were read)
            let size = done.min(meta.size);
            old.push(ObjectMeta { size, ..meta });
        }
    }
    let newest_input_ms = new
        .iter()
        .map(|f| f.meta.last_modified.timestamp_millis())
        .max();
    // (with nothing new, the files read before give the columns)
    // a target with rejects on takes malformed events as rejects
    let unreadable =
        takes_rejects(&target.properties).then(|| Arc::new(UnreadableLines::default()));
    let reader = FlowUse {
        name: &flow.name,
        keys: &flow.keys,
        stored_as: flow.stored_as_scd_type,
        known_columns: &target.user_schema,
    };
    let table =
        DebeziumTable::open(path, store, new, &old, Some(&reader), unreadable.clone()).await?;
    let scan = LogicalPlanBuilder::scan("debezium", provider_as_source(Arc::new(table)), None)?;
    // a time of day (`time` columns: Debezium's `MicroTime`, `NanoTime`,
    // Connect's `Time`) has no Delta type: the flow stores it as its text
    // (`10:15:30.5`), which orders as the times do
    let columns = scan
        .schema()
        .fields()
        .iter()
        .map(|f| {
            let column = Expr::Column(Column::new_unqualified(f.name()));
            match f.data_type() {
                DataType::Time32(_) | DataType::Time64(_) => {
                    cast(column, DataType::Utf8).alias(f.name())
                }
                _ => column,
            }
        })
        .collect::<Vec<_>>();
    let plan = scan.project(columns)?.build()?;
    let checkpoint = SourceCheckpoint::EventFiles { files: checkpoint };
    Ok(SourceRead {
        plan,
        checkpoint: Some((
            key,
            serde_json::to_string(&checkpoint)
                .map_err(|e| DataFusionError::External(Box::new(e)))?,
        )),
        newest_input_ms,
        unreadable,
    })
}

/// What to read of the event file `meta` (named `name` in messages),
/// `done` bytes of which were read before (`u64::MAX`: all of it, as it was
/// then): from `done` to its readable end ([`readable_end`]); a file now
/// shorter than what was read was rewritten, an error.
async fn part_to_read(
    store: Arc<dyn ObjectStore>,
    meta: ObjectMeta,
    done: u64,
    name: String,
) -> Result<(u64, u64)> {
    if done == u64::MAX || done == meta.size {
        return Ok((done, done));
    }
    let rewritten = |how: String| {
        DataFusionError::Execution(format!(
            "file '{name}' {how}: it was rewritten, and its events cannot be told from those \
             read; nothing was committed (REFRESH ... FULL reads every file anew)"
        ))
    };
    if meta.size < done {
        return Err(rewritten(format!(
            "has {} bytes, fewer than the {done} read from it before",
            meta.size
        )));
    }
    if done > 0 {
        // what was read ended a line or a JSON value; a file written anew,
        // longer, has anything there
        let last = store
            .get_range(&meta.location, done - 1..done)
            .await
            .map_err(|e| DataFusionError::External(Box::new(e)))?;
        if !matches!(last.first(), Some(b'\n' | b'}' | b'\r' | b' ' | b'\t')) {
            return Err(rewritten(format!(
                "no longer ends a line where the {done} bytes read from it before did"
            )));
        }
    }
    Ok((done, readable_end(&store, &meta, done).await?))
}

/// The rows a streaming table inserted or updated from version `from` on
/// (but in the versions `undone`, see `streams::restored_away`): its change
/// data feed's `insert` and `update_postimage` rows.
fn changed_rows(
    table: &ScdTable,
    from: u64,
    provider: &Arc<dyn TableProvider>,
    undone: &BTreeSet<i64>,
) -> Result<LogicalPlan> {
    let changes = changes_provider(table, from, None)?;
    let columns = columns_of(provider);
    LogicalPlanBuilder::scan(CHANGES_SCAN, provider_as_source(changes), None)?
        .filter(col("_change_type").in_list(vec![lit("insert"), lit("update_postimage")], false))?
        .filter(not_in_versions(undone))?
        .project(columns)?
        .build()
}

/// A filter keeping the change rows of other versions than `versions`.
fn not_in_versions(versions: &BTreeSet<i64>) -> Expr {
    if versions.is_empty() {
        return lit(true);
    }
    cast(col("_commit_version"), arrow::datatypes::DataType::Int64)
        .in_list(versions.iter().map(|v| lit(*v)).collect(), true)
}

/// The rows the commits of a streaming table from version `from` on added,
/// read as an append-only stream: a commit that updated or deleted rows fails
/// the read ([`StreamRead::AppendOnly`]) or is skipped whole
/// ([`StreamRead::SkipChangeCommits`]).
async fn appended_rows(
    state: &SessionState,
    table: &ScdTable,
    from: u64,
    provider: &Arc<dyn TableProvider>,
    mode: StreamRead,
    name: &str,
    version: u64,
) -> Result<LogicalPlan> {
    let changes = || -> Result<LogicalPlanBuilder> {
        LogicalPlanBuilder::scan(
            CHANGES_SCAN,
            provider_as_source(changes_provider(table, from, None)?),
            None,
        )
    };
    let versions = streams::versions_not_appended(state, table, from, version, mode, name).await?;
    let columns = columns_of(provider);
    let kept = col("_change_type")
        .eq(lit("insert"))
        .and(not_in_versions(&versions));
    changes()?.filter(kept)?.project(columns)?.build()
}

/// A reference to each column of `provider`, in order.
fn columns_of(provider: &Arc<dyn TableProvider>) -> Vec<Expr> {
    provider
        .schema()
        .fields()
        .iter()
        .map(|f| Expr::Column(Column::new_unqualified(f.name())))
        .collect()
}

/// No rows, with the columns of `schema`.
fn empty_with(schema: arrow::datatypes::SchemaRef) -> Result<LogicalPlan> {
    let schema = datafusion::common::DFSchema::try_from(schema.as_ref().clone())?;
    Ok(LogicalPlan::EmptyRelation(
        datafusion::logical_expr::EmptyRelation {
            produce_one_row: false,
            schema: Arc::new(schema),
        },
    ))
}

/// The rows of `snapshot` (a streaming table at `version`, committed at
/// `at_ms`) as its change feed would have them had they all been inserted
/// then: the columns of `changes` (the table's change feed schema), each
/// row an `insert` of that version.
fn snapshot_as_changes(
    snapshot: LogicalPlan,
    changes: &arrow::datatypes::Schema,
    version: u64,
    at_ms: i64,
) -> Result<LogicalPlan> {
    let columns = changes
        .fields()
        .iter()
        .map(|f| {
            let value = match f.name().as_str() {
                "_change_type" => lit("insert"),
                "_commit_version" => lit(version as i64),
                "_commit_timestamp" => lit(ScalarValue::TimestampMicrosecond(
                    Some(at_ms.saturating_mul(1000)),
                    Some("UTC".into()),
                )),
                name => col(Column::new_unqualified(name)),
            };
            cast(value, f.data_type().clone()).alias(f.name())
        })
        .collect::<Vec<_>>();
    LogicalPlanBuilder::from(snapshot).project(columns)?.build()
}
