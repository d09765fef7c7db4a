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
    AutoCdcExec, CdcPhysicalCodec, CdcWriteExec, SnapshotDiffExec, StoreResolver,
};
use datafusion_autocdc::{AutoCdcConfig, CdcSession};
use datafusion_proto::physical_plan::{DefaultPhysicalProtoConverter, PhysicalExtensionCodec};
use object_store::memory::InMemory;
use object_store::ObjectStore;

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
            "{} {} {} {} {:?} {:?}",
            r.target, r.flow, r.location, r.buckets, r.key_indices, r.change_feed
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

#[tokio::test]
async fn a_decoded_write_writes_where_the_location_resolves() -> Result<()> {
    let store: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
    let s = CdcSession::open(AutoCdcConfig::in_memory_on(Arc::clone(&store))).await?;
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
