//! `CdcPhysicalCodec`: our execution plans as bytes, so that a plan holding
//! them can be shipped to another process (DataFusion's `datafusion-proto`,
//! Ballista's executors) and rebuilt there.
//!
//! | node               | payload                                                   | inputs              |
//! |--------------------|-----------------------------------------------------------|---------------------|
//! | `AutoCdcExec`      | its `FoldSpec` (flow, layout, SCD type, tracked columns, partial updates, fold options) | events, truncates |
//! | `SnapshotDiffExec` | flow, key positions, version and written-at (as `datafusion-proto` scalars), engine options | snapshot ⋈ live rows |
//! | `CdcWriteExec`     | target, flow, table location, buckets, key positions, change feed mode, per partition | the fold (or an append flow's rows) |
//! | `StoredFilesExec`  | the row mask of each state-store file (Roaring, portable format) | the Parquet scan |
//!
//! The payload is one tagged JSON document (the node's configuration is
//! small; the plans around it are `datafusion-proto` protobuf). Children are
//! encoded by `datafusion-proto` itself and handed back in order.
//!
//! `CdcCommitExec` is never encoded: the commit runs where the update was
//! planned. `CdcWriteExec` writes through an object store, which is not
//! data: the payload carries the table's location, and the writer finds the
//! store for it when it runs, in its task's `RuntimeEnv` (or with the
//! resolver given to [`CdcPhysicalCodec::with_store_resolver`]), so every
//! process that runs it must reach the warehouse.

use std::fmt;
use std::sync::Arc;

use datafusion::common::{DataFusionError, Result, ScalarValue};
use datafusion::execution::object_store::ObjectStoreUrl;
use datafusion::execution::TaskContext;
use datafusion::logical_expr::ScalarUDF;
use datafusion::physical_plan::ExecutionPlan;
use datafusion_proto::physical_plan::{PhysicalExtensionCodec, PhysicalProtoConverterExtension};
use object_store::path::Path;
use object_store::prefix::PrefixStore;
use object_store::ObjectStore;
use prost::Message;
use roaring::RoaringTreemap;
use serde::{Deserialize, Serialize};
use url::Url;

use super::{AutoCdcExec, CdcWriteExec, SnapshotDiffExec};
use crate::fit::{fit_udf, FIT};
use crate::fold::FoldSpec;
use crate::logical::WriteRequest;
use crate::raise::{raise_udf, RAISE};
use crate::table::commit::ChangeFeed;
use crate::table::plain_files::{RowMask, StoredFilesExec};
use crate::table::writer::FileCompression;
use crate::table::TableName;

/// Finds the object store rooted at a table's location.
pub type StoreResolver =
    Arc<dyn Fn(&Url, &TaskContext) -> Result<Arc<dyn ObjectStore>> + Send + Sync>;

/// Encodes and decodes [`AutoCdcExec`], [`SnapshotDiffExec`] and
/// [`CdcWriteExec`] (see the module docs). Compose it with other codecs
/// (Ballista's) rather than replacing them: it refuses every other node.
#[derive(Clone)]
pub struct CdcPhysicalCodec {
    stores: StoreResolver,
}

impl fmt::Debug for CdcPhysicalCodec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CdcPhysicalCodec").finish_non_exhaustive()
    }
}

impl Default for CdcPhysicalCodec {
    fn default() -> Self {
        Self {
            stores: Arc::new(store_from_runtime),
        }
    }
}

impl CdcPhysicalCodec {
    /// A codec finding stores in the decoding task's `RuntimeEnv`.
    pub fn new() -> Self {
        Self::default()
    }

    /// A codec finding stores with `resolver` (a process whose stores are
    /// not registered in its `RuntimeEnv`, tests on an in-memory store).
    pub fn with_store_resolver(resolver: StoreResolver) -> Self {
        Self { stores: resolver }
    }
}

/// The store registered for `location`'s scheme and authority in the
/// task's `RuntimeEnv`, rooted at `location`'s path.
pub(crate) fn store_from_runtime(
    location: &Url,
    ctx: &TaskContext,
) -> Result<Arc<dyn ObjectStore>> {
    let root = ObjectStoreUrl::parse(&location[..url::Position::BeforePath])?;
    let store = ctx.runtime_env().object_store(&root)?;
    let prefix =
        Path::from_url_path(location.path()).map_err(|e| DataFusionError::External(Box::new(e)))?;
    Ok(Arc::new(PrefixStore::new(store, prefix)))
}

/// The payload of one node.
#[derive(Debug, Serialize, Deserialize)]
#[serde(tag = "node")]
enum Node {
    AutoCdc {
        spec: FoldSpec,
    },
    SnapshotDiff {
        flow: String,
        key_indices: Vec<usize>,
        /// `datafusion-proto` encoding of the version scalar.
        version: Vec<u8>,
        /// `datafusion-proto` encoding of the written-at scalar.
        written_at: Vec<u8>,
        indexed: bool,
        indexed_cap: usize,
    },
    Write {
        target: TableName,
        flow: String,
        location: Url,
        buckets: i32,
        #[serde(default)]
        compression: FileCompression,
        key_indices: Vec<usize>,
        change_feed: ChangeFeed,
        #[serde(default)]
        per_partition: bool,
    },
    StoredFiles {
        masks: Vec<Option<Mask>>,
    },
}

/// A [`RowMask`] in a payload.
#[derive(Debug, Serialize, Deserialize)]
struct Mask {
    deleted: bool,
    /// The positions, in Roaring's portable serialisation.
    rows: Vec<u8>,
}

impl Mask {
    fn encode(mask: &RowMask) -> Result<Self> {
        let (deleted, rows) = match mask {
            RowMask::Deleted(rows) => (true, rows),
            RowMask::Selected(rows) => (false, rows),
        };
        let mut bytes = Vec::with_capacity(rows.serialized_size());
        rows.serialize_into(&mut bytes)
            .map_err(|e| DataFusionError::Internal(format!("CdcPhysicalCodec: a row mask: {e}")))?;
        Ok(Self {
            deleted,
            rows: bytes,
        })
    }

    fn decode(self) -> Result<RowMask> {
        let rows = RoaringTreemap::deserialize_from(self.rows.as_slice())
            .map_err(|e| DataFusionError::Internal(format!("CdcPhysicalCodec: a row mask: {e}")))?;
        Ok(if self.deleted {
            RowMask::Deleted(rows)
        } else {
            RowMask::Selected(rows)
        })
    }
}

fn encode_scalar(value: &ScalarValue) -> Result<Vec<u8>> {
    let proto = datafusion_proto::protobuf::ScalarValue::try_from(value)
        .map_err(|e| DataFusionError::Internal(format!("encoding {value:?}: {e}")))?;
    Ok(proto.encode_to_vec())
}

fn decode_scalar(bytes: &[u8]) -> Result<ScalarValue> {
    let proto = datafusion_proto::protobuf::ScalarValue::decode(bytes)
        .map_err(|e| DataFusionError::Internal(format!("decoding a scalar: {e}")))?;
    ScalarValue::try_from(&proto)
        .map_err(|e| DataFusionError::Internal(format!("decoding a scalar: {e}")))
}

/// `inputs` as exactly `N` children of `node`.
fn children<const N: usize>(
    node: &str,
    inputs: &[Arc<dyn ExecutionPlan>],
) -> Result<[Arc<dyn ExecutionPlan>; N]> {
    <[Arc<dyn ExecutionPlan>; N]>::try_from(inputs.to_vec()).map_err(|got| {
        DataFusionError::Internal(format!(
            "CdcPhysicalCodec: {node} takes {N} inputs, got {}",
            got.len()
        ))
    })
}

impl PhysicalExtensionCodec for CdcPhysicalCodec {
    fn try_decode(
        &self,
        buf: &[u8],
        inputs: &[Arc<dyn ExecutionPlan>],
        _ctx: &TaskContext,
        _proto_converter: &dyn PhysicalProtoConverterExtension,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        let node: Node = serde_json::from_slice(buf).map_err(|e| {
            DataFusionError::Internal(format!("CdcPhysicalCodec: not one of our nodes: {e}"))
        })?;
        Ok(match node {
            Node::AutoCdc { spec } => {
                let [events, truncates] = children("AutoCdcExec", inputs)?;
                Arc::new(AutoCdcExec::try_new(spec, events, truncates)?)
            }
            Node::SnapshotDiff {
                flow,
                key_indices,
                version,
                written_at,
                indexed,
                indexed_cap,
            } => {
                let [input] = children("SnapshotDiffExec", inputs)?;
                Arc::new(SnapshotDiffExec::new(
                    flow,
                    key_indices,
                    decode_scalar(&version)?,
                    decode_scalar(&written_at)?,
                    input,
                    indexed,
                    indexed_cap,
                ))
            }
            Node::Write {
                target,
                flow,
                location,
                buckets,
                compression,
                key_indices,
                change_feed,
                per_partition,
            } => {
                let [input] = children("CdcWriteExec", inputs)?;
                let request = WriteRequest {
                    target,
                    flow,
                    location,
                    buckets,
                    compression,
                    key_indices,
                    change_feed,
                };
                Arc::new(
                    CdcWriteExec::try_new(Arc::new(request), input)?
                        .per_partition(per_partition)
                        .with_store_resolver(Arc::clone(&self.stores)),
                )
            }
            Node::StoredFiles { masks } => {
                let [input] = children("StoredFilesExec", inputs)?;
                let masks = masks
                    .into_iter()
                    .map(|m| m.map(Mask::decode).transpose())
                    .collect::<Result<Vec<_>>>()?;
                Arc::new(StoredFilesExec::try_new(Arc::new(masks), input)?)
            }
        })
    }

    fn try_encode(
        &self,
        node: Arc<dyn ExecutionPlan>,
        buf: &mut Vec<u8>,
        _proto_converter: &dyn PhysicalProtoConverterExtension,
    ) -> Result<()> {
        let payload = if let Some(exec) = node.downcast_ref::<AutoCdcExec>() {
            if exec.key_exchange().is_some() {
                // its partitions share the batches of one process
                return Err(DataFusionError::NotImplemented(format!(
                    "CdcPhysicalCodec: the fold of flow '{}' routes its events in one process \
                     (SET autocdc.key_exchange = false for plans run elsewhere)",
                    exec.flow()
                )));
            }
            Node::AutoCdc {
                spec: exec.spec().clone(),
            }
        } else if let Some(exec) = node.downcast_ref::<SnapshotDiffExec>() {
            let options = exec.options();
            if exec.key_exchange().is_some() {
                // its partitions share the batches of one process
                return Err(DataFusionError::NotImplemented(format!(
                    "CdcPhysicalCodec: the snapshot diff of flow '{}' routes its input in one \
                     process (SET autocdc.key_exchange = false for plans run elsewhere)",
                    options.flow
                )));
            }
            Node::SnapshotDiff {
                flow: options.flow.to_string(),
                key_indices: options.key_indices.to_vec(),
                version: encode_scalar(options.version)?,
                written_at: encode_scalar(options.written_at)?,
                indexed: options.indexed,
                indexed_cap: options.indexed_cap,
            }
        } else if let Some(exec) = node.downcast_ref::<CdcWriteExec>() {
            if exec.is_statement() {
                return Err(DataFusionError::NotImplemented(format!(
                    "CdcPhysicalCodec: the write of a DML statement on {} runs where it was planned",
                    exec.request().target
                )));
            }
            let request = exec.request();
            Node::Write {
                target: request.target.clone(),
                flow: request.flow.clone(),
                location: request.location.clone(),
                buckets: request.buckets,
                compression: request.compression,
                key_indices: request.key_indices.clone(),
                change_feed: request.change_feed,
                per_partition: exec.is_per_partition(),
            }
        } else if let Some(exec) = node.downcast_ref::<StoredFilesExec>() {
            Node::StoredFiles {
                masks: exec
                    .masks()
                    .iter()
                    .map(|m| m.as_ref().map(Mask::encode).transpose())
                    .collect::<Result<_>>()?,
            }
        } else {
            return Err(DataFusionError::NotImplemented(format!(
                "CdcPhysicalCodec encodes AutoCdcExec, SnapshotDiffExec, CdcWriteExec and StoredFilesExec, not {}",
                node.name()
            )));
        };
        serde_json::to_writer(buf, &payload)
            .map_err(|e| DataFusionError::Internal(format!("CdcPhysicalCodec: {e}")))
    }

    fn try_encode_udf(&self, node: &ScalarUDF, buf: &mut Vec<u8>) -> Result<()> {
        // ours by name; DataFusion's own are looked up by name where decoded
        if node.name() == RAISE || node.name() == FIT {
            buf.extend_from_slice(node.name().as_bytes());
        }
        Ok(())
    }

    fn try_decode_udf(&self, name: &str, _buf: &[u8]) -> Result<Arc<ScalarUDF>> {
        match name {
            RAISE => Ok(raise_udf()),
            FIT => Ok(fit_udf()),
            _ => Err(DataFusionError::NotImplemented(format!(
                "CdcPhysicalCodec: no scalar function '{name}'"
            ))),
        }
    }
}
