//! `CdcPhysicalCodec` round trips: every node of real update plans (SCD 1
//! with deletes and truncates, SCD 2 with tracked columns, BITEMPORAL, both
//! partial-update options, snapshot flows of both types) is encoded, decoded
//! over the same children and compared with the original: the same plan
//! text and the same configuration. A decoded write writes to the store
//! the decoding side resolves for the table's location.

use std::sync::Arc;

use datafusion::common::Result;
use datafusion::execution::TaskContext;
use datafusion::physical_plan::{displayable, ExecutionPlan};
use datafusion_autocdc::physical::{
    AutoCdcExec, CdcCommitExec, CdcPhysicalCodec, CdcWriteExec, SnapshotDiffExec, StoreResolver,
};
use datafusion_autocdc::{AutoCdcConfig, CdcSession};
use datafusion_proto::physical_plan::{DefaultPhysicalProtoConverter, PhysicalExtensionCodec};
use object_store::memory::InMemory;
use object_store::ObjectStore;
use prost::Message;

mod common;
use common::exec;

/// Our nodes of `plan`, depth first.
fn our_nodes(plan: &Arc<dyn ExecutionPlan>, out: &mut Vec<Arc<dyn ExecutionPlan>>) {
    let ours = plan.downcast_ref::<AutoCdcExec>().is_some()
        || plan.downcast_ref::<SnapshotDiffExec>().is_some()
        || plan.downcast_ref::<CdcWriteExec>().is_some();
    if ours {
        out.push(Arc::clone(plan));
    }
    for child in plan.children() {
        our_nodes(child, out);
    }
}

/// The configuration of one of our nodes, as text.
fn configuration(node: &Arc<dyn ExecutionPlan>) -> String {
    if let Some(exec) = node.downcast_ref::<AutoCdcExec>() {
        format!("{:?}", exec.spec())
    } else if let Some(exec) = node.downcast_ref::<SnapshotDiffExec>() {
        format!("{:?}", exec.options())
    } else if let Some(exec) = node.downcast_ref::<CdcWriteExec>() {
        let r = exec.request();
        format!(
            "{} {} {} {} {:?} {:?} {:?}",
            r.target, r.flow, r.location, r.buckets, r.compression, r.key_indices, r.change_feed
        )
    } else {
        unreachable!("only our nodes")
    }
}

/// Encode and decode every node of ours in `plan`; returns how many.
fn round_trip(codec: &CdcPhysicalCodec, plan: &Arc<dyn ExecutionPlan>) -> Result<usize> {
    let mut nodes = Vec::new();
    our_nodes(plan, &mut nodes);
    let ctx = TaskContext::default();
    for node in &nodes {
        let mut buf = Vec::new();
        codec.try_encode(
            Arc::clone(node),
            &mut buf,
            &DefaultPhysicalProtoConverter {},
        )?;
        let children: Vec<_> = node.children().into_iter().cloned().collect();
        let decoded = codec.try_decode(&buf, &children, &ctx, &DefaultPhysicalProtoConverter {})?;
        assert_eq!(decoded.name(), node.name());
        assert_eq!(configuration(&decoded), configuration(node));
        assert_eq!(
            displayable(decoded.as_ref()).indent(true).to_string(),
            displayable(node.as_ref()).indent(true).to_string()
        );
    }
    Ok(nodes.len())
}

/// A codec resolving every location to `store` (the session's in-memory
/// warehouse), so decoded writes land in the same warehouse.
fn codec_on(store: Arc<dyn ObjectStore>) -> CdcPhysicalCodec {
    let resolver: StoreResolver = Arc::new(move |location, _ctx| {
        let prefix = object_store::path::Path::from_url_path(location.path())
            .map_err(|e| datafusion::error::DataFusionError::External(Box::new(e)))?;
        Ok(Arc::new(object_store::prefix::PrefixStore::new(
            Arc::clone(&store),
            prefix,
        )) as Arc<dyn ObjectStore>)
    });
    CdcPhysicalCodec::with_store_resolver(resolver)
}

#[tokio::test]
async fn every_node_and_option_round_trips() -> Result<()> {
    let store: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
    let s = CdcSession::open(AutoCdcConfig::in_memory_on(Arc::clone(&store))).await?;
    // plans for other processes hash-repartition their events (the key
    // exchange shares batches within one process)
    exec(&s, "SET autocdc.key_exchange = false").await;
    exec(
        &s,
        "CREATE TABLE ev (id INT, a TEXT, b INT, op TEXT, seq INT, st INT, cols VARCHAR[]) AS VALUES
           (1, 'x', 1, 'U', 1, 10, ['a']), (2, 'y', 2, 'U', 1, 10, NULL), (1, NULL, 3, 'D', 2, 20, NULL)",
    )
    .await;
    exec(
        &s,
        "CREATE TABLE snap (id INT, a TEXT) AS VALUES (1, 'x'), (2, 'y')",
    )
    .await;
    let flows = [
        ("scd1", "KEYS (id) APPLY AS DELETE WHEN op = 'D' APPLY AS TRUNCATE WHEN op = 'T' SEQUENCE BY seq COLUMNS * EXCEPT (op, st, cols) STORED AS SCD TYPE 1"),
        ("scd2", "KEYS (id) APPLY AS DELETE WHEN op = 'D' SEQUENCE BY seq COLUMNS * EXCEPT (op, st, cols) STORED AS SCD TYPE 2 TRACK HISTORY ON (a)"),
        ("bi", "KEYS (id) APPLY AS DELETE WHEN op = 'D' SEQUENCE BY seq SYSTEM SEQUENCE BY st COLUMNS * EXCEPT (op, st, cols) STORED AS BITEMPORAL"),
        ("ignore_nulls", "KEYS (id) SEQUENCE BY seq COLUMNS * EXCEPT (op, st, cols) STORED AS SCD TYPE 1 IGNORE NULL UPDATES ON (a)"),
        ("listed", "KEYS (id) SEQUENCE BY STRUCT(seq, st) COLUMNS * EXCEPT (op, seq, st) STORED AS SCD TYPE 2 COLUMNS TO UPDATE cols"),
    ];
    let mut seen = 0;
    for (target, clauses) in flows {
        exec(&s, &format!("CREATE STREAMING TABLE {target}")).await;
        exec(
            &s,
            &format!("CREATE FLOW {target} AS AUTO CDC INTO {target} FROM ev {clauses}"),
        )
        .await;
        for (_, plan) in s.update_plans(target).await? {
            seen += round_trip(&codec_on(Arc::clone(&store)), &plan)?;
        }
    }
    for (target, scd) in [("snap1", 1), ("snap2", 2)] {
        exec(&s, &format!("CREATE STREAMING TABLE {target}")).await;
        exec(
            &s,
            &format!("CREATE FLOW {target} AS AUTO CDC INTO {target} FROM SNAPSHOT (SELECT * FROM snap) KEYS (id) STORED AS SCD TYPE {scd}"),
        )
        .await;
        let plans = s.update_plans(target).await?;
        let mut nodes = Vec::new();
        our_nodes(&plans[0].1, &mut nodes);
        assert!(
            nodes
                .iter()
                .any(|n| n.downcast_ref::<SnapshotDiffExec>().is_some()),
            "a snapshot update diffs"
        );
        seen += round_trip(&codec_on(Arc::clone(&store)), &plans[0].1)?;
    }
    // every flow's plan has a fold and a write; snapshot plans also a diff
    assert!(seen >= 2 * 7 + 2, "{seen} nodes");
    Ok(())
}

/// A session of two partitions on `store` holding table `ev` and flow `f`
/// into `t`, and our operators in the plan of `t`'s next update.
async fn one_flow_update(
    store: &Arc<dyn ObjectStore>,
) -> Result<(CdcSession, Vec<Arc<dyn ExecutionPlan>>)> {
    let s = CdcSession::open(AutoCdcConfig::in_memory_on(Arc::clone(store))).await?;
    exec(&s, "SET datafusion.execution.target_partitions = 2").await;
    exec(
        &s,
        "CREATE TABLE ev (id INT, v TEXT, seq INT) AS VALUES (1, 'a', 1), (2, 'b', 1)",
    )
    .await;
    exec(&s, "CREATE STREAMING TABLE t").await;
    exec(
        &s,
        "CREATE FLOW f AS AUTO CDC INTO t FROM ev KEYS (id) SEQUENCE BY seq",
    )
    .await;
    let (_, plan) = s.update_plans("t").await?.remove(0);
    let mut nodes = Vec::new();
    our_nodes(&plan, &mut nodes);
    Ok((s, nodes))
}

/// A fold that routes its events itself (`autocdc.key_exchange`, the
/// default) shares batches between its partitions in one process: the
/// codec refuses it, naming the flow and the setting, instead of shipping a
/// plan that would fold each partition's share of the keys without them
/// being routed.
#[tokio::test]
async fn a_fold_routing_its_own_events_is_refused_by_name() -> Result<()> {
    let store: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
    let (_s, nodes) = one_flow_update(&store).await?;
    let fold = nodes
        .into_iter()
        .find(|n| n.downcast_ref::<AutoCdcExec>().is_some())
        .expect("a fold");
    assert_eq!(
        fold.downcast_ref::<AutoCdcExec>()
            .and_then(|f| f.key_exchange()),
        Some(2)
    );
    let mut buf = Vec::new();
    let err = codec_on(Arc::clone(&store))
        .try_encode(fold, &mut buf, &DefaultPhysicalProtoConverter {})
        .expect_err("not shipped");
    let message = err.to_string();
    assert!(
        message.contains("flow 'f'") && message.contains("SET autocdc.key_exchange = false"),
        "{message}"
    );
    Ok(())
}

/// A snapshot diff routing its live and snapshot rows itself is refused
/// alike, naming its flow and the setting.
#[tokio::test]
async fn a_snapshot_diff_routing_its_own_rows_is_refused_by_name() -> Result<()> {
    let store: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
    let s = CdcSession::open(AutoCdcConfig::in_memory_on(Arc::clone(&store))).await?;
    exec(&s, "SET datafusion.execution.target_partitions = 2").await;
    exec(
        &s,
        "CREATE TABLE snap (id INT, v TEXT) AS VALUES (1, 'a'), (2, 'b')",
    )
    .await;
    exec(&s, "CREATE STREAMING TABLE t").await;
    exec(
        &s,
        "CREATE FLOW sf AS AUTO CDC INTO t FROM SNAPSHOT (SELECT * FROM snap) KEYS (id)",
    )
    .await;
    exec(&s, "REFRESH STREAMING TABLE t").await;
    let (_, plan) = s.update_plans("t").await?.remove(0);
    let mut nodes = Vec::new();
    our_nodes(&plan, &mut nodes);
    let diff = nodes
        .into_iter()
        .find(|n| n.downcast_ref::<SnapshotDiffExec>().is_some())
        .expect("a diff");
    assert_eq!(
        diff.downcast_ref::<SnapshotDiffExec>()
            .and_then(|d| d.key_exchange()),
        Some(2)
    );
    let mut buf = Vec::new();
    let err = codec_on(Arc::clone(&store))
        .try_encode(diff, &mut buf, &DefaultPhysicalProtoConverter {})
        .expect_err("not shipped");
    let message = err.to_string();
    assert!(
        message.contains("flow 'sf'") && message.contains("SET autocdc.key_exchange = false"),
        "{message}"
    );
    Ok(())
}

#[tokio::test]
async fn a_decoded_write_writes_where_the_location_resolves() -> Result<()> {
    let store: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
    let (s, nodes) = one_flow_update(&store).await?;
    let write = nodes
        .into_iter()
        .find(|n| n.downcast_ref::<CdcWriteExec>().is_some())
        .expect("a write");
    // decoded by a codec whose stores are another, empty one: its files go there
    let elsewhere: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
    let codec = codec_on(Arc::clone(&elsewhere));
    let mut buf = Vec::new();
    codec.try_encode(
        Arc::clone(&write),
        &mut buf,
        &DefaultPhysicalProtoConverter {},
    )?;
    let children: Vec<_> = write.children().into_iter().cloned().collect();
    let ctx = s.context().task_ctx();
    let decoded = codec.try_decode(&buf, &children, &ctx, &DefaultPhysicalProtoConverter {})?;
    let manifest = datafusion::physical_plan::collect(decoded, ctx).await?;
    let rows: usize = manifest.iter().map(|b| b.num_rows()).sum();
    assert!(rows > 0, "the manifest lists the written files");
    use futures::TryStreamExt;
    let written: Vec<_> = elsewhere.list(None).try_collect().await?;
    assert!(
        written
            .iter()
            .any(|o| o.location.as_ref().ends_with(".parquet")),
        "{written:?}"
    );
    Ok(())
}

#[test]
fn other_nodes_are_refused() {
    let codec = CdcPhysicalCodec::new();
    let empty: Arc<dyn ExecutionPlan> = Arc::new(datafusion::physical_plan::empty::EmptyExec::new(
        Arc::new(arrow::datatypes::Schema::empty()),
    ));
    let err = codec
        .try_encode(empty, &mut Vec::new(), &DefaultPhysicalProtoConverter {})
        .unwrap_err();
    assert!(err.to_string().contains("not EmptyExec"), "{err}");
    let err = codec
        .try_decode(
            b"{}",
            &[],
            &TaskContext::default(),
            &DefaultPhysicalProtoConverter {},
        )
        .unwrap_err();
    assert!(err.to_string().contains("not one of our nodes"), "{err}");
}

/// Ships the writing part of every update through bytes: the child of each
/// `CdcCommitExec` is encoded with `datafusion-proto` and our codec, decoded
/// and put back — what a cluster does with it, without the cluster.
struct ShipWrites {
    codec: CdcPhysicalCodec,
    /// Where plans are decoded: a context that knows the warehouse store.
    decoder: datafusion::prelude::SessionContext,
    shipped: Arc<std::sync::atomic::AtomicUsize>,
    /// Partitions the decoded plan is optimised for again (`None`: the
    /// session's), as a cluster's scheduler does.
    partitions: Option<usize>,
}

impl std::fmt::Debug for ShipWrites {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ShipWrites")
    }
}

impl datafusion::physical_optimizer::PhysicalOptimizerRule for ShipWrites {
    fn optimize(
        &self,
        plan: Arc<dyn ExecutionPlan>,
        config: &datafusion::config::ConfigOptions,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        use datafusion::common::tree_node::{Transformed, TreeNode};
        use datafusion_proto::physical_plan::AsExecutionPlan;
        use datafusion_proto::protobuf::PhysicalPlanNode;
        plan.transform_up(|node| {
            if node.downcast_ref::<CdcCommitExec>().is_none() {
                return Ok(Transformed::no(node));
            }
            let child = Arc::clone(node.children()[0]);
            let bytes =
                PhysicalPlanNode::try_from_physical_plan(child, &self.codec)?.encode_to_vec();
            let decoded = PhysicalPlanNode::decode(bytes.as_slice())
                .map_err(|e| datafusion::error::DataFusionError::External(Box::new(e)))?
                .try_into_physical_plan(&self.decoder.task_ctx(), &self.codec)?;
            // where a plan lands it is optimised again (perhaps for more
            // partitions): here any file scan that may be split into byte
            // ranges is split
            let mut eager = config.clone();
            if let Some(partitions) = self.partitions {
                eager.execution.target_partitions = partitions;
            }
            eager.optimizer.repartition_file_min_size = 0;
            let decoded =
                datafusion::physical_optimizer::ensure_requirements::EnsureRequirements::new()
                    .optimize(decoded, &eager)?;
            self.shipped
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            #[allow(deprecated)]
            let node = node.with_new_children(vec![decoded])?;
            Ok(Transformed::yes(node))
        })
        .map(|t| t.data)
    }

    fn name(&self) -> &str {
        "ship_writes"
    }

    fn schema_check(&self) -> bool {
        true
    }
}

/// The same script on a local session and on one that plans as for a
/// cluster (plain Parquet reads, per-partition writes) and ships every
/// update's write through bytes: equal targets and change feeds. The
/// updates after the first are small, so they read stored rows by
/// position and leave deletion vectors that later reads apply.
/// Where the script takes the plan of `s1`'s next update.
const PLAN_OF_S1: &str = "-- plan of s1";

#[tokio::test]
async fn shipped_updates_equal_local_ones() -> Result<()> {
    let script = [
        "SET autocdc.deletion_vector_max_fraction = 1000",
        "CREATE TABLE ev (id INT, a TEXT, op TEXT, seq INT)",
        "INSERT INTO ev SELECT CAST(value AS INT), CASE WHEN value > 0 THEN 'v' || value END, 'U', 1 FROM generate_series(1, 60)",
        "CREATE TABLE snap (id INT, a TEXT) AS VALUES (1, 'x'), (2, 'y'), (3, 'z')",
        "CREATE STREAMING TABLE s1 TBLPROPERTIES ('autocdc.buckets' = '16')",
        "CREATE FLOW s1 AS AUTO CDC INTO s1 FROM ev KEYS (id) APPLY AS DELETE WHEN op = 'D' APPLY AS TRUNCATE WHEN op = 'T' SEQUENCE BY seq COLUMNS * EXCEPT (op)",
        "CREATE STREAMING TABLE s2 TBLPROPERTIES ('autocdc.buckets' = '16', 'autocdc.compression' = 'lz4')",
        "CREATE FLOW s2 AS AUTO CDC INTO s2 FROM ev KEYS (id) APPLY AS DELETE WHEN op = 'D' SEQUENCE BY seq COLUMNS * EXCEPT (op) STORED AS SCD TYPE 2",
        "CREATE STREAMING TABLE sn TBLPROPERTIES ('autocdc.buckets' = '3')",
        "CREATE FLOW sn AS AUTO CDC INTO sn FROM SNAPSHOT (SELECT * FROM snap) KEYS (id) STORED AS SCD TYPE 2",
        // small updates: deletion vectors and reads by position
        "CREATE OR REPLACE TABLE ev (id INT, a TEXT, op TEXT, seq INT) AS VALUES (2, 'b2', 'U', 2), (3, NULL, 'D', 2), (1, 'late', 'U', 0)",
        "REFRESH STREAMING TABLE s1",
        PLAN_OF_S1,
        "REFRESH STREAMING TABLE s2",
        "INSERT INTO snap VALUES (4, 'w')",
        "DELETE FROM snap WHERE id = 1",
        "REFRESH STREAMING TABLE sn",
        // files with vectors are read again, then a truncate
        "CREATE OR REPLACE TABLE ev (id INT, a TEXT, op TEXT, seq INT) AS VALUES (2, 'b3', 'U', 3), (4, 'd2', 'U', 3), (6, NULL, 'T', 4), (5, 'e2', 'U', 5)",
        "REFRESH STREAMING TABLE s1",
        "REFRESH STREAMING TABLE s2",
        "UPDATE snap SET a = 'y2' WHERE id = 2",
        "REFRESH STREAMING TABLE sn",
    ];
    let queries = [
        "SELECT * FROM s1 ORDER BY id",
        "SELECT id, a, __START_AT, __END_AT FROM s2 ORDER BY id, __START_AT",
        "SELECT id, a, __END_AT IS NULL AS current FROM sn ORDER BY id, a",
        "SELECT id, a, _change_type, _commit_version FROM table_changes('s1', 0) ORDER BY _commit_version, id, _change_type",
        "SELECT id, a, _change_type, _commit_version FROM table_changes('sn', 0) ORDER BY _commit_version, id, _change_type",
    ];
    let run = |shipped: Option<Arc<std::sync::atomic::AtomicUsize>>, partitions| async move {
        let store: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
        let mut config = AutoCdcConfig::in_memory_on(Arc::clone(&store)).with_session_config(
            datafusion::prelude::SessionConfig::new()
                .with_target_partitions(3)
                .with_batch_size(2),
        );
        if let Some(shipped) = &shipped {
            let decoder = datafusion::prelude::SessionContext::new();
            decoder.register_object_store(
                &url::Url::parse("memory:///").expect("a URL"),
                Arc::clone(&store),
            );
            config = config.with_physical_optimizer_rule(Arc::new(ShipWrites {
                codec: codec_on(Arc::clone(&store)),
                decoder,
                shipped: Arc::clone(shipped),
                partitions,
            }));
        }
        let s = CdcSession::open(config).await?;
        if shipped.is_some() {
            exec(&s, "SET autocdc.plain_parquet_reads = true").await;
            exec(&s, "SET autocdc.key_exchange = false").await;
        }
        let mut text = String::new();
        for sql in script {
            if sql == PLAN_OF_S1 {
                let plans = s.update_plans("s1").await?;
                text = displayable(plans[0].1.as_ref()).indent(true).to_string();
            } else {
                exec(&s, sql).await;
            }
        }
        let mut out = Vec::new();
        for q in queries {
            let batches = s.sql(q).await?.collect().await?;
            out.push(arrow::util::pretty::pretty_format_batches(&batches)?.to_string());
        }
        Ok::<_, datafusion::error::DataFusionError>((out, text))
    };
    let (local, _) = run(None, None).await?;
    // optimised again for 16 partitions where it lands: the fold and the
    // writes have other partitions than planned, the targets are the same
    let (wider, _) = run(Some(Arc::default()), Some(16)).await?;
    for (l, r) in local.iter().zip(&wider) {
        assert_eq!(l, r);
    }
    let shipped = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let (remote, plan) = run(Some(Arc::clone(&shipped)), None).await?;
    for (l, r) in local.iter().zip(&remote) {
        assert_eq!(l, r);
    }
    assert!(shipped.load(std::sync::atomic::Ordering::Relaxed) >= 9);
    assert!(plan.contains("StoredFilesExec"), "{plan}");
    // files with deletion vectors (of the small updates) were read as such
    assert!(
        plan.lines()
            .any(|l| l.contains("StoredFilesExec") && !l.ends_with("masked=0")),
        "{plan}"
    );
    assert!(plan.contains("per_partition"), "{plan}");
    assert!(!plan.contains("DeltaScanExec"), "{plan}");
    Ok(())
}
