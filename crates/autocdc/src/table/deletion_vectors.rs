//! Deletion vectors: retiring the superseded rows of a data file without
//! rewriting it.
//!
//! An update that touches a few keys of a large table writes its new rows to
//! new files and marks the old rows of those keys as deleted in a *deletion
//! vector* of each file that holds one (Delta protocol, "Deletion Vectors"):
//!
//! ```text
//!  touched keys ─► KeySet ─┐
//!                          ├─► superseded_rows(file) ─► ∪ old vector ─► write_vectors ─► remove + add(file, dv)
//!  data file (key columns) ┘
//! ```
//!
//! A vector is a set of row positions in the file's physical order. It is
//! stored in a `deletion_vector_<uuid>.bin` file at the table root (one file
//! holds the vectors of every data file an update touches), in the protocol's
//! format: a version byte `1`, then per vector its size (u32, big endian),
//! the `RoaringBitmapArray` magic (u32, little endian), the portable 64-bit
//! Roaring serialisation, and a CRC-32 of magic and bitmap (big endian).
//! Readers (delta-rs' scan, Spark, ...) skip the marked rows.

use std::cell::OnceCell;
use std::ops::Range;
use std::sync::Arc;

use arrow::array::{ArrayRef, RecordBatch, UInt32Array};
use arrow::compute::{cast, take};
use arrow::datatypes::SchemaRef;
use arrow::row::RowConverter;
use datafusion::common::hash_utils::{create_hashes, RandomState};
use datafusion::common::{DataFusionError, HashSet, Result};
use deltalake_core::kernel::{DeletionVectorDescriptor, StorageType};
use deltalake_core::parquet::arrow::arrow_reader::{
    ArrowReaderMetadata, ArrowReaderOptions, RowSelection,
};
use deltalake_core::parquet::arrow::async_reader::AsyncFileReader;
use deltalake_core::parquet::arrow::{ParquetRecordBatchStreamBuilder, ProjectionMask};
use deltalake_core::parquet::bloom_filter::Sbbf;
use deltalake_core::parquet::file::metadata::{PageIndexPolicy, ParquetMetaData};
use futures::TryStreamExt;
use object_store::path::Path;
use object_store::{ObjectStore, ObjectStoreExt, PutPayload};
use roaring::RoaringTreemap;

use super::file_tail::{Tail, TailReader, TAIL_BYTES};
use super::key_bloom::KeyValues;
use super::probe_index::{filter_ranges, leaves_of, CachedIndex, KeyFilters, ProbeIndex};

use crate::fold::rows::row_converter;

/// Magic number of the `RoaringBitmapArray` format.
const MAGIC: u32 = 1_681_511_377;

/// Vectors of one file at most this far apart are read with one request.
const COALESCE_GAP: u64 = 1 << 20;

/// Length of a z85-encoded UUID in a `u` descriptor.
const ENCODED_UUID_LEN: usize = 20;

fn dv_error(what: impl std::fmt::Display) -> DataFusionError {
    DataFusionError::Execution(format!("deletion vector: {what}"))
}

fn crc32() -> crc::Crc<u32> {
    crc::Crc::<u32>::new(&crc::CRC_32_ISO_HDLC)
}

/// The object path (relative to the table root) of a `u` descriptor's file.
fn relative_file(descriptor: &DeletionVectorDescriptor) -> Result<Path> {
    let encoded = &descriptor.path_or_inline_dv;
    let split = encoded
        .len()
        .checked_sub(ENCODED_UUID_LEN)
        .filter(|&s| encoded.is_char_boundary(s))
        .ok_or_else(|| dv_error(format!("malformed path '{encoded}'")))?;
    let (prefix, uuid) = encoded.split_at(split);
    let bytes = z85::decode(uuid).map_err(|e| dv_error(format!("path '{encoded}': {e}")))?;
    let uuid =
        uuid::Uuid::from_slice(&bytes).map_err(|e| dv_error(format!("path '{encoded}': {e}")))?;
    let name = format!("deletion_vector_{uuid}.bin");
    Ok(if prefix.is_empty() {
        Path::from(name)
    } else {
        Path::from(format!("{prefix}/{name}"))
    })
}

/// Decode one serialised vector (magic + bitmap).
fn decode(bytes: &[u8]) -> Result<RoaringTreemap> {
    let magic = bytes
        .get(..4)
        .map(|m| u32::from_le_bytes([m[0], m[1], m[2], m[3]]))
        .ok_or_else(|| dv_error("truncated vector"))?;
    if magic != MAGIC {
        return Err(dv_error(format!("unknown format (magic {magic})")));
    }
    RoaringTreemap::deserialize_from(&bytes[4..]).map_err(|e| dv_error(e.to_string()))
}

/// The rows `descriptor` marks as deleted, read from the table's `store`
/// (rooted at the table).
pub async fn read_vector(
    store: &Arc<dyn ObjectStore>,
    descriptor: &DeletionVectorDescriptor,
) -> Result<RoaringTreemap> {
    let mut vectors = read_vectors(store, std::slice::from_ref(descriptor)).await?;
    vectors
        .pop()
        .ok_or_else(|| DataFusionError::Internal("a deletion vector was not read".into()))
}

/// The rows each of `descriptors` marks as deleted, in order, read from the
/// table's `store`. The vectors of one file (an update writes all of its
/// vectors to one) are read together: a file costs one request, not one per
/// vector.
pub async fn read_vectors(
    store: &Arc<dyn ObjectStore>,
    descriptors: &[DeletionVectorDescriptor],
) -> Result<Vec<RoaringTreemap>> {
    let mut vectors: Vec<Option<RoaringTreemap>> = vec![None; descriptors.len()];
    // stored ones: (index, range) per file
    let mut by_file: Vec<(Path, Vec<Wanted>)> = Vec::new();
    for (i, descriptor) in descriptors.iter().enumerate() {
        match descriptor.storage_type {
            StorageType::Inline => {
                let bytes = z85::decode(&descriptor.path_or_inline_dv)
                    .map_err(|e| dv_error(format!("inline vector: {e}")))?;
                vectors[i] = Some(decode(&bytes)?);
            }
            StorageType::AbsolutePath => {
                return Err(DataFusionError::NotImplemented(format!(
                    "deletion vector at an absolute path ('{}'): only vectors stored in the table are supported",
                    descriptor.path_or_inline_dv
                )))
            }
            StorageType::UuidRelativePath => {
                let path = relative_file(descriptor)?;
                let offset = descriptor.offset.unwrap_or(1).max(0) as u64;
                let size = u64::try_from(descriptor.size_in_bytes)
                    .map_err(|_| dv_error(format!("negative size in '{path}'")))?;
                // size prefix, magic + bitmap, CRC
                let range = offset..offset + 4 + size + 4;
                match by_file.iter_mut().find(|(p, _)| *p == path) {
                    Some((_, ranges)) => ranges.push((i, range)),
                    None => by_file.push((path, vec![(i, range)])),
                }
            }
        }
    }
    for (path, mut wanted) in by_file {
        // one read per run of vectors less than COALESCE_GAP apart (their
        // bytes sliced here: a truncated file reads short, never panics)
        wanted.sort_by_key(|(_, r)| r.start);
        let mut at = 0;
        while at < wanted.len() {
            let start = wanted[at].1.start;
            let (mut end, mut next) = (wanted[at].1.end, at + 1);
            while next < wanted.len() && wanted[next].1.start <= end.saturating_add(COALESCE_GAP) {
                end = end.max(wanted[next].1.end);
                next += 1;
            }
            let bytes = store.get_range(&path, start..end).await?;
            for (i, range) in &wanted[at..next] {
                let from = usize::try_from(range.start - start).unwrap_or(usize::MAX);
                let to = usize::try_from(range.end - start).unwrap_or(usize::MAX);
                let read = bytes
                    .get(from.min(bytes.len())..to.min(bytes.len()))
                    .unwrap_or(&[]);
                vectors[*i] = Some(stored_vector(&path, range.clone(), read)?);
            }
            at = next;
        }
    }
    vectors
        .into_iter()
        .map(|v| {
            v.ok_or_else(|| DataFusionError::Internal("a deletion vector was not read".into()))
        })
        .collect()
}

/// A vector to read: its index among the descriptors, its bytes in its file.
type Wanted = (usize, Range<u64>);

/// Check and decode the vector stored at `range` of `path` (`bytes`).
fn stored_vector(path: &Path, range: Range<u64>, bytes: &[u8]) -> Result<RoaringTreemap> {
    let (offset, expected) = (range.start, range.end - range.start);
    // (a store clamps a range to the object's end: a short read is a
    // truncated file)
    if bytes.len() as u64 != expected {
        return Err(dv_error(format!(
            "'{path}' at {offset}: {} bytes where the descriptor says {expected}: the file is truncated",
            bytes.len(),
        )));
    }
    let size = expected - 8;
    let stated = u32::from_be_bytes([bytes[0], bytes[1], bytes[2], bytes[3]]) as u64;
    if stated != size {
        return Err(dv_error(format!(
            "'{path}' at {offset}: size {stated}, descriptor says {size}"
        )));
    }
    let body = &bytes[4..4 + size as usize];
    let tail = &bytes[4 + size as usize..];
    let checksum = u32::from_be_bytes([tail[0], tail[1], tail[2], tail[3]]);
    if crc32().checksum(body) != checksum {
        return Err(dv_error(format!("'{path}' at {offset}: checksum mismatch")));
    }
    decode(body)
}

/// Write `vectors` into one new deletion vector file at the table root;
/// returns one descriptor per vector, in order.
pub async fn write_vectors(
    store: &Arc<dyn ObjectStore>,
    vectors: &[RoaringTreemap],
) -> Result<Vec<DeletionVectorDescriptor>> {
    let uuid = uuid::Uuid::new_v4();
    let encoded = z85::encode(uuid.as_bytes());
    let mut file = vec![1u8];
    let mut descriptors = Vec::with_capacity(vectors.len());
    for vector in vectors {
        let mut body = MAGIC.to_le_bytes().to_vec();
        vector
            .serialize_into(&mut body)
            .map_err(|e| dv_error(e.to_string()))?;
        let size = i32::try_from(body.len()).map_err(|_| dv_error("vector over 2 GiB"))?;
        let offset = i32::try_from(file.len()).map_err(|_| dv_error("file over 2 GiB"))?;
        file.extend_from_slice(&(size as u32).to_be_bytes());
        file.extend_from_slice(&body);
        file.extend_from_slice(&crc32().checksum(&body).to_be_bytes());
        descriptors.push(DeletionVectorDescriptor {
            storage_type: StorageType::UuidRelativePath,
            path_or_inline_dv: encoded.clone(),
            offset: Some(offset),
            size_in_bytes: size,
            cardinality: vector.len() as i64,
        });
    }
    let path = Path::from(format!("deletion_vector_{uuid}.bin"));
    store.put(&path, PutPayload::from(file)).await?;
    Ok(descriptors)
}

/// A set of keys (any key columns), for probing the rows of data files.
///
/// Probing is vectorised: a probed batch's keys are hashed column-wise
/// (DataFusion's `create_hashes`) and looked up by hash; only the rows whose
/// hash is a key's (the members, and rare collisions) are converted to the
/// row format and compared exactly. Most rows of a data file are not in
/// the set, so most never leave their columns.
#[derive(Debug)]
pub struct KeySet {
    converter: RowConverter,
    /// The keys in the row format: exact membership.
    keys: HashSet<Box<[u8]>>,
    /// The keys' hashes (`hash_state`): the first, cheap test.
    hashes: HashSet<u64>,
    hash_state: RandomState,
    names: Vec<String>,
    /// Types of the key columns (the row format compares bytes: probed
    /// columns are cast to them).
    schema: SchemaRef,
    /// The keys as bloom filters check them, when few enough to prune row
    /// groups with ([`super::key_bloom`]).
    values: Option<KeyValues>,
}

impl KeySet {
    /// The keys of `batches`, whose columns are the key columns `names`.
    pub fn try_new(names: Vec<String>, batches: &[RecordBatch]) -> Result<Self> {
        Self::at_most(names, batches, usize::MAX)?
            .ok_or_else(|| DataFusionError::Internal("a key set over no limit".into()))
    }

    /// The keys of `batches` (as [`Self::try_new`]), or `None` as soon as
    /// they are more than `max` (the rest is not read).
    pub fn at_most(
        names: Vec<String>,
        batches: &[RecordBatch],
        max: usize,
    ) -> Result<Option<Self>> {
        let first = batches
            .first()
            .ok_or_else(|| DataFusionError::Internal("a key set needs a schema".into()))?;
        let schema = first.schema();
        let converter = row_converter(&schema, &(0..schema.fields().len()).collect::<Vec<_>>())?;
        let hash_state = RandomState::default();
        let (mut keys, mut hashes) = (HashSet::default(), HashSet::default());
        let mut buffer = Vec::new();
        for batch in batches {
            let rows = converter.convert_columns(batch.columns())?;
            keys.extend(rows.iter().map(|r| Box::<[u8]>::from(r.as_ref())));
            if keys.len() > max {
                return Ok(None);
            }
            hashes.extend(hash_rows(batch.columns(), &hash_state, &mut buffer)?.iter());
        }
        let values = KeyValues::try_new(batches, keys.len())?;
        Ok(Some(Self {
            converter,
            keys,
            hashes,
            hash_state,
            names,
            schema,
            values,
        }))
    }

    /// Number of distinct keys.
    pub fn len(&self) -> usize {
        self.keys.len()
    }

    /// Whether the set has no key.
    pub fn is_empty(&self) -> bool {
        self.keys.is_empty()
    }

    /// Positions (offset by `first`) of the rows of `columns` whose key is in
    /// the set; `hashes` is a scratch buffer reused across calls.
    fn mark(
        &self,
        columns: &[ArrayRef],
        first: u64,
        hashes: &mut Vec<u64>,
        marks: &mut RoaringTreemap,
    ) -> Result<()> {
        let hashes = hash_rows(columns, &self.hash_state, hashes)?;
        let candidates: UInt32Array = hashes
            .iter()
            .enumerate()
            .filter(|(_, h)| self.hashes.contains(*h))
            .map(|(i, _)| i as u32)
            .collect();
        if candidates.is_empty() {
            return Ok(());
        }
        let columns = columns
            .iter()
            .map(|c| take(c.as_ref(), &candidates, None))
            .collect::<std::result::Result<Vec<_>, _>>()?;
        let rows = self.converter.convert_columns(&columns)?;
        let found = rows
            .iter()
            .zip(candidates.values())
            .filter(|(row, _)| self.keys.contains(row.as_ref()))
            .map(|(_, &i)| first + u64::from(i));
        // candidates ascend, so the positions can be appended in order
        marks
            .append(found)
            .map_err(|e| DataFusionError::Internal(format!("row positions out of order: {e}")))?;
        Ok(())
    }
}

/// The hashes of the rows of `columns`, in `buffer`.
fn hash_rows<'a>(
    columns: &[ArrayRef],
    state: &RandomState,
    buffer: &'a mut Vec<u64>,
) -> Result<&'a [u64]> {
    let n = columns.first().map_or(0, |c| c.len());
    buffer.clear();
    buffer.resize(n, 0);
    Ok(create_hashes(columns, state, buffer)?)
}

/// Positions of the rows of the Parquet data file `path` (`size` bytes) whose
/// key is in `keys`, in the file's physical row order (deleted rows
/// included).
///
/// Also returns the file's Parquet metadata, page index included when the
/// file has one, so that reading rows of the file later need not load it
/// again.
pub async fn superseded_rows(
    store: &Arc<dyn ObjectStore>,
    path: &Path,
    size: u64,
    keys: &KeySet,
) -> Result<(RoaringTreemap, ArrowReaderMetadata)> {
    let probed = probe_file(store, path, size, keys, None).await?;
    Ok((probed.rows, probed.metadata))
}

/// A data file probed for keys ([`probe_file`]).
pub(crate) struct ProbedFile {
    /// Positions of the rows whose key is one of the keys.
    pub(crate) rows: RoaringTreemap,
    /// The file's Parquet metadata, page index included when it has one.
    pub(crate) metadata: ArrowReaderMetadata,
    /// The end of the file, as read to probe it: all of a small file whose
    /// pages were read.
    pub(crate) tail: Option<Tail>,
}

/// [`superseded_rows`], with the file's tail as read to probe it, for a
/// reader of its rows. `cached`: the file's entry in the session's cache of
/// what probes need ([`super::probe_index`]), used and filled.
pub(crate) async fn probe_file(
    store: &Arc<dyn ObjectStore>,
    path: &Path,
    size: u64,
    keys: &KeySet,
    cached: Option<&CachedIndex<'_>>,
) -> Result<ProbedFile> {
    // (footer, metadata, page index, filters and, in a small file, the key
    // pages: one request; none but the pages when cached)
    let mut reader = TailReader::new(store, path, size);
    let (metadata, filters) = match cached.and_then(CachedIndex::get) {
        Some(index) => (
            index.metadata,
            index.filters.filter(|f| f.names == keys.names),
        ),
        None => {
            let options =
                ArrowReaderOptions::new().with_page_index_policy(PageIndexPolicy::Optional);
            (
                ArrowReaderMetadata::load_async(&mut reader, options).await?,
                None,
            )
        }
    };
    let leaves = key_leaves(metadata.metadata(), keys);
    let filters = match filters {
        Some(filters) => Some(filters),
        None => {
            let filters = read_key_filters(
                &mut reader,
                path,
                metadata.metadata(),
                leaves.as_deref(),
                keys,
            )
            .await?
            .map(Arc::new);
            if let Some(cached) = cached {
                cached.put(ProbeIndex {
                    metadata: metadata.clone(),
                    filters: filters.clone(),
                });
            }
            filters
        }
    };
    let groups = row_groups_to_probe(
        metadata.metadata(),
        leaves.as_deref(),
        filters.as_deref().map(|f| &f.filters),
        keys,
    );
    // (first row, rows) of each run of rows to read, in the file's row order
    let first_leaf = leaves.as_ref().and_then(|leaves| leaves.first().copied());
    let (spans, selection) = rows_to_probe(metadata.metadata(), &groups, first_leaf, keys);
    let mut marks = RoaringTreemap::new();
    if spans.is_empty() {
        return Ok(ProbedFile {
            rows: marks,
            metadata,
            tail: None,
        });
    }
    if size <= TAIL_BYTES {
        // (a small file, whole: its key pages, and its rows if they are wanted)
        reader.get_bytes(0..size).await?;
    }
    let tail = reader.held();
    let builder = ParquetRecordBatchStreamBuilder::new_with_metadata(reader, metadata.clone());
    let mask = ProjectionMask::columns(
        builder.parquet_schema(),
        keys.names.iter().map(String::as_str),
    );
    let groups = groups.into_iter().map(|(g, _)| g).collect();
    let mut builder = builder.with_projection(mask).with_row_groups(groups);
    if let Some(selection) = selection {
        builder = builder.with_row_selection(selection);
    }
    let mut stream = builder.build()?;
    // (run being read, its rows not read yet)
    let (mut group, mut left) = (0usize, spans[0].1);
    let mut hashes = Vec::new();
    while let Some(batch) = stream.try_next().await? {
        // the projection keeps file order: put the columns in key order, as
        // the key set's types (the row format compares bytes)
        let columns = keys
            .names
            .iter()
            .zip(keys.schema.fields())
            .map(|(n, field)| {
                let column = batch.column_by_name(n).ok_or_else(|| {
                    DataFusionError::Execution(format!(
                        "data file '{path}' has no key column '{n}'"
                    ))
                })?;
                if column.data_type() == field.data_type() {
                    Ok(Arc::clone(column))
                } else {
                    Ok(cast(column, field.data_type())?)
                }
            })
            .collect::<Result<Vec<_>>>()?;
        // a batch may run over the end of a row group: mark each part at
        // its own position
        let mut offset = 0usize;
        while offset < batch.num_rows() {
            while left == 0 {
                group += 1;
                left = spans.get(group).map(|span| span.1).ok_or_else(|| {
                    DataFusionError::Internal(format!(
                        "data file '{path}': more rows than the runs probed"
                    ))
                })?;
            }
            let n = (batch.num_rows() - offset).min(left as usize);
            let part: Vec<ArrayRef> = columns.iter().map(|c| c.slice(offset, n)).collect();
            let (start, rows) = spans[group];
            let first = start + (rows - left);
            keys.mark(&part, first, &mut hashes, &mut marks)?;
            offset += n;
            left -= n as u64;
        }
    }
    Ok(ProbedFile {
        rows: marks,
        metadata,
        tail,
    })
}

/// The runs of rows of the row groups `groups` to probe for `keys`, as
/// `(first row, rows)` in the file's row order, and the selection that reads
/// them from those row groups (`None`: every row of them). Within a row
/// group, only the pages of the first key column that may hold one of the
/// keys its bloom filters admitted ([`KeyValues::page_may_hold`]) are read,
/// when the file has a page index; `leaf` is that column's leaf
/// ([`key_leaves`]).
fn rows_to_probe(
    metadata: &ParquetMetaData,
    groups: &[ProbedGroup],
    leaf: Option<usize>,
    keys: &KeySet,
) -> (Vec<(u64, u64)>, Option<RowSelection>) {
    let row_groups = metadata.row_groups();
    let firsts: Vec<u64> = row_groups
        .iter()
        .scan(0u64, |first, rg| {
            let start = *first;
            *first += rg.num_rows().max(0) as u64;
            Some(start)
        })
        .collect();
    let whole = || -> Vec<(u64, u64)> {
        groups
            .iter()
            .map(|&(g, _)| (firsts[g], row_groups[g].num_rows().max(0) as u64))
            .collect()
    };
    let (Some(values), Some(leaf), Some(column_index), Some(offset_index)) = (
        &keys.values,
        leaf,
        metadata.column_index(),
        metadata.offset_index(),
    ) else {
        return (whole(), None);
    };
    // runs relative to the selected row groups read back to back
    let mut spans: Vec<(u64, u64)> = Vec::new();
    let mut relative: Vec<Range<usize>> = Vec::new();
    let mut read_before = 0usize;
    let every_key = OnceCell::new();
    for (g, admitted) in groups {
        let admitted = admitted
            .as_deref()
            .unwrap_or_else(|| every_key.get_or_init(|| (0..keys.len()).collect::<Vec<_>>()));
        let g = *g;
        let rows = row_groups[g].num_rows().max(0) as usize;
        let pages = offset_index
            .get(g)
            .and_then(|columns| columns.get(leaf))
            .map(|o| o.page_locations());
        let index = column_index.get(g).and_then(|columns| columns.get(leaf));
        let runs: Vec<Range<usize>> = match (pages, index) {
            // (pages in row order, as every writer puts them; a damaged
            // offset index reads the whole row group)
            (Some(pages), Some(index))
                if !pages.is_empty()
                    && pages
                        .windows(2)
                        .all(|w| w[0].first_row_index <= w[1].first_row_index) =>
            {
                (0..pages.len())
                    .filter(|&p| values.page_may_hold(index, p, admitted))
                    .map(|p| {
                        let start = pages[p].first_row_index.max(0) as usize;
                        let end = pages
                            .get(p + 1)
                            .map_or(rows, |next| next.first_row_index.max(0) as usize);
                        start..end.min(rows)
                    })
                    .collect()
            }
            _ => std::iter::once(0..rows).collect(),
        };
        for run in runs.into_iter().filter(|r| !r.is_empty()) {
            let shifted = read_before + run.start..read_before + run.end;
            let first = firsts[g] + run.start as u64;
            match (relative.last_mut(), spans.last_mut()) {
                // (adjacent both as read and in the file)
                (Some(last), Some(span))
                    if last.end == shifted.start && span.0 + span.1 == first =>
                {
                    last.end = shifted.end;
                    span.1 += run.len() as u64;
                }
                _ => {
                    relative.push(shifted);
                    spans.push((first, run.len() as u64));
                }
            }
        }
        read_before += rows;
    }
    let selection = (relative.iter().map(|r| r.len()).sum::<usize>() < read_before)
        .then(|| RowSelection::from_consecutive_ranges(relative.into_iter(), read_before));
    (spans, selection)
}

/// The leaf column of each of `keys`' columns in a file (key columns are
/// top-level columns of one leaf); `None` when one is missing.
fn key_leaves(metadata: &ParquetMetaData, keys: &KeySet) -> Option<Vec<usize>> {
    leaves_of(metadata, &keys.names)
}

/// A row group to probe and the keys (indices into the key set's values)
/// its bloom filters admit (`None`: any key).
type ProbedGroup = (usize, Option<Vec<usize>>);

/// The key filters of the file `path` (its metadata: `metadata`; `leaves`:
/// its key columns' leaves, [`key_leaves`]) worth checking for `keys`, read
/// in one request; `None` when none is: the keys are many, or the columns
/// unknown or of types the filters cannot check.
async fn read_key_filters(
    reader: &mut TailReader,
    path: &Path,
    metadata: &ParquetMetaData,
    leaves: Option<&[usize]>,
    keys: &KeySet,
) -> Result<Option<KeyFilters>> {
    let (Some(values), Some(leaves)) = (&keys.values, leaves) else {
        return Ok(None);
    };
    let checkable = checkable_columns(metadata, leaves, values);
    if !checkable.contains(&true) {
        return Ok(None);
    }
    let ranges = filter_ranges(metadata, leaves, &checkable).ok_or_else(|| {
        dv_error(format!(
            "data file '{path}': a bloom filter with a negative offset or length"
        ))
    })?;
    let bytes = reader
        .get_byte_ranges(ranges.iter().map(|(_, _, r)| r.clone()).collect())
        .await?;
    Ok(Some(KeyFilters::read(
        keys.names.clone(),
        metadata,
        &ranges,
        bytes,
    )?))
}

/// Whether each key column's filters can be checked for `values` in the file
/// `metadata` describes (`leaves`: the key columns' leaves).
fn checkable_columns(
    metadata: &ParquetMetaData,
    leaves: &[usize],
    values: &KeyValues,
) -> Vec<bool> {
    let schema = metadata.file_metadata().schema_descr();
    leaves
        .iter()
        .enumerate()
        .map(|(c, &leaf)| values.checkable(c, schema.column(leaf).physical_type()))
        .collect()
}

/// The row groups of the file `metadata` describes that may hold one of
/// `keys`: those whose key filters (by row group and key column, read by
/// [`read_key_filters`] or cached) admit a key ([`super::key_bloom`]), with
/// the keys they admit; all of them, for any key, when the keys are many or
/// there are no filters to check. A filter is checked only where its column
/// is stored as the keys' type (`leaves`: the key columns' leaves).
fn row_groups_to_probe(
    metadata: &ParquetMetaData,
    leaves: Option<&[usize]>,
    filters: Option<&Vec<Vec<Option<Sbbf>>>>,
    keys: &KeySet,
) -> Vec<ProbedGroup> {
    let every_group = || (0..metadata.num_row_groups()).map(|g| (g, None)).collect();
    let (Some(values), Some(filters), Some(leaves)) = (&keys.values, filters, leaves) else {
        return every_group();
    };
    let checkable = checkable_columns(metadata, leaves, values);
    if filters.len() != metadata.num_row_groups() {
        return every_group();
    }
    let mut usable: Vec<Option<&Sbbf>> = Vec::with_capacity(leaves.len());
    filters
        .iter()
        .enumerate()
        .filter_map(|(group, filters)| {
            usable.clear();
            usable.extend((0..leaves.len()).map(|c| {
                filters
                    .get(c)
                    .and_then(Option::as_ref)
                    .filter(|_| checkable[c])
            }));
            let admitted = values.admitted(&usable);
            (!admitted.is_empty()).then_some((group, Some(admitted)))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use arrow::array::{Int64Array, StringArray};
    use arrow::datatypes::{DataType, Field, Schema};
    use object_store::memory::InMemory;

    /// The row groups of the file `path` that a probe for `keys` reads.
    async fn probed_groups(
        store: &Arc<dyn ObjectStore>,
        path: &Path,
        size: u64,
        metadata: &ParquetMetaData,
        keys: &KeySet,
    ) -> Result<Vec<ProbedGroup>> {
        let leaves = key_leaves(metadata, keys);
        let mut reader = TailReader::new(store, path, size);
        let filters =
            read_key_filters(&mut reader, path, metadata, leaves.as_deref(), keys).await?;
        Ok(row_groups_to_probe(
            metadata,
            leaves.as_deref(),
            filters.as_ref().map(|f| &f.filters),
            keys,
        ))
    }

    /// The first key column's leaf in the file `metadata` describes.
    fn first_leaf(metadata: &ArrowReaderMetadata, keys: &KeySet) -> Option<usize> {
        key_leaves(metadata.metadata(), keys).and_then(|leaves| leaves.first().copied())
    }

    #[test]
    fn key_sets_are_counted_up_to_their_limit() -> Result<()> {
        let schema = Arc::new(Schema::new(vec![Field::new("id", DataType::Int64, false)]));
        let batch = |ids: Vec<i64>| {
            RecordBatch::try_new(Arc::clone(&schema), vec![Arc::new(Int64Array::from(ids))])
        };
        // 3 distinct keys over two batches (a repeat within and across)
        let batches = [batch(vec![1, 2, 2])?, batch(vec![2, 3])?];
        let names = || vec!["id".to_string()];
        assert_eq!(
            KeySet::at_most(names(), &batches, 3)?.map(|k| k.len()),
            Some(3)
        );
        assert!(KeySet::at_most(names(), &batches, 2)?.is_none());
        assert_eq!(KeySet::try_new(names(), &batches)?.len(), 3);
        Ok(())
    }

    #[tokio::test]
    async fn vectors_round_trip_through_one_file() -> Result<()> {
        let store: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
        let a: RoaringTreemap = [0u64, 5, 7, 1 << 33].into_iter().collect();
        let b: RoaringTreemap = (100u64..2000).collect();
        let descriptors = write_vectors(&store, &[a.clone(), b.clone()]).await?;
        assert_eq!(descriptors.len(), 2);
        assert_eq!(descriptors[0].offset, Some(1));
        assert_eq!(descriptors[0].cardinality, 4);
        assert_eq!(descriptors[1].cardinality, 1900);
        assert_eq!(descriptors[0].path_or_inline_dv.len(), ENCODED_UUID_LEN);
        assert_eq!(read_vector(&store, &descriptors[0]).await?, a);
        assert_eq!(read_vector(&store, &descriptors[1]).await?, b);
        Ok(())
    }

    #[tokio::test]
    async fn vectors_are_read_together_and_a_short_file_is_an_error() -> Result<()> {
        let store: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
        let a: RoaringTreemap = [1u64, 2, 3].into_iter().collect();
        let b: RoaringTreemap = (0..1900u64).map(|i| i * 7).collect();
        let c: RoaringTreemap = [9u64].into_iter().collect();
        let first = write_vectors(&store, &[a.clone(), b.clone()]).await?;
        let other = write_vectors(&store, std::slice::from_ref(&c)).await?;
        // any order, two files, a vector twice
        let wanted = [&first[1], &other[0], &first[0], &first[1]].map(Clone::clone);
        assert_eq!(
            read_vectors(&store, &wanted).await?,
            [b.clone(), c, a.clone(), b]
        );
        // the first file cut inside its second vector: that one is an error
        let path = relative_file(&first[0])?;
        let bytes = store.get(&path).await?.bytes().await?;
        store
            .put(&path, PutPayload::from(bytes.slice(..bytes.len() - 10)))
            .await?;
        let err = read_vectors(&store, &first).await.unwrap_err();
        assert!(err.to_string().contains("the file is truncated"), "{err}");
        // cut before the second vector starts
        let end_of_first = (first[0].offset.unwrap_or(1) + 8 + first[0].size_in_bytes) as usize;
        store
            .put(&path, PutPayload::from(bytes.slice(..end_of_first)))
            .await?;
        let err = read_vectors(&store, &first).await.unwrap_err();
        assert!(err.to_string().contains("the file is truncated"), "{err}");
        assert_eq!(read_vectors(&store, &first[..1]).await?, [a]);
        Ok(())
    }

    #[tokio::test]
    async fn a_corrupt_vector_is_an_error() -> Result<()> {
        let store: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
        let a: RoaringTreemap = [1u64, 2, 3].into_iter().collect();
        let mut descriptor = write_vectors(&store, &[a]).await?.remove(0);
        let path = relative_file(&descriptor)?;
        let mut bytes = store.get(&path).await?.bytes().await?.to_vec();
        let last = bytes.len() - 5;
        bytes[last] ^= 0xff;
        store.put(&path, PutPayload::from(bytes)).await?;
        let err = read_vector(&store, &descriptor).await.unwrap_err();
        assert!(err.to_string().contains("checksum"), "{err}");
        descriptor.size_in_bytes += 1;
        assert!(read_vector(&store, &descriptor).await.is_err());
        descriptor.size_in_bytes -= 1;
        // a truncated file: the store returns the bytes it has
        let bytes = store.get(&path).await?.bytes().await?;
        for keep in [3, 6, bytes.len() - 1] {
            store
                .put(&path, PutPayload::from(bytes.slice(..keep)))
                .await?;
            let err = read_vector(&store, &descriptor).await.unwrap_err();
            assert!(
                err.to_string().contains("the file is truncated"),
                "{keep}: {err}"
            );
        }
        // (cut before the vector starts: the store refuses the range)
        store.put(&path, PutPayload::from(bytes.slice(..0))).await?;
        assert!(read_vector(&store, &descriptor).await.is_err());
        Ok(())
    }

    /// Rows are found by key in a Parquet file across batches, in physical
    /// order, even when the file stores the key as another type.
    #[tokio::test]
    async fn superseded_rows_of_a_parquet_file() -> Result<()> {
        use arrow::array::Int32Array;
        use deltalake_core::parquet::arrow::ArrowWriter;
        use deltalake_core::parquet::file::properties::WriterProperties;

        let file_schema = Arc::new(Schema::new(vec![
            Field::new("v", DataType::Utf8, true),
            Field::new("id", DataType::Int32, false),
        ]));
        let mut bytes = Vec::new();
        let properties = WriterProperties::builder()
            .set_max_row_group_row_count(Some(3))
            .build();
        let mut writer =
            ArrowWriter::try_new(&mut bytes, Arc::clone(&file_schema), Some(properties))?;
        writer.write(&RecordBatch::try_new(
            file_schema,
            vec![
                Arc::new(StringArray::from(vec!["a"; 8])),
                Arc::new(Int32Array::from(vec![5, 1, 4, 2, 3, 2, 9, 1])),
            ],
        )?)?;
        writer.close()?;
        let store: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
        let path = Path::from("part-0.parquet");
        let size = bytes.len() as u64;
        store.put(&path, PutPayload::from(bytes)).await?;

        let key_schema = Arc::new(Schema::new(vec![Field::new("id", DataType::Int64, false)]));
        let keys =
            RecordBatch::try_new(key_schema, vec![Arc::new(Int64Array::from(vec![1, 2, 7]))])?;
        let set = KeySet::try_new(vec!["id".into()], &[keys])?;
        let (marks, metadata) = superseded_rows(&store, &path, size, &set).await?;
        assert_eq!(metadata.metadata().file_metadata().num_rows(), 8);
        assert_eq!(marks.iter().collect::<Vec<_>>(), vec![1, 3, 5, 7]);
        Ok(())
    }

    /// With bloom filters on the key column, only the row groups that may
    /// hold a key are read, and the rows found are the same; a file storing
    /// the key under a narrower type is read whole (its filters hashed
    /// other bytes).
    #[tokio::test]
    async fn bloom_filters_skip_row_groups_without_the_keys() -> Result<()> {
        use deltalake_core::parquet::arrow::ArrowWriter;
        use deltalake_core::parquet::file::properties::WriterProperties;
        use deltalake_core::parquet::schema::types::ColumnPath;

        let store: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
        let mut files = Vec::new();
        for (name, data_type) in [("wide", DataType::Int64), ("narrow", DataType::Int32)] {
            let schema = Arc::new(Schema::new(vec![Field::new(
                "id",
                data_type.clone(),
                false,
            )]));
            let ids: ArrayRef = Arc::new(Int64Array::from_iter_values(0..20_000));
            let properties = WriterProperties::builder()
                .set_max_row_group_row_count(Some(1000))
                .set_column_bloom_filter_enabled(ColumnPath::from("id"), true)
                .set_column_bloom_filter_fpp(ColumnPath::from("id"), 0.01)
                .build();
            let mut bytes = Vec::new();
            let mut writer =
                ArrowWriter::try_new(&mut bytes, Arc::clone(&schema), Some(properties))?;
            writer.write(&RecordBatch::try_new(
                schema,
                vec![cast(&ids, &data_type)?],
            )?)?;
            writer.close()?;
            let path = Path::from(format!("{name}.parquet"));
            let size = bytes.len() as u64;
            store.put(&path, PutPayload::from(bytes)).await?;
            files.push((path, size));
        }
        let key_schema = Arc::new(Schema::new(vec![Field::new("id", DataType::Int64, false)]));
        let keys = RecordBatch::try_new(
            key_schema,
            vec![Arc::new(Int64Array::from(vec![
                1_500, 1_999, 17_000, 99_999,
            ]))],
        )?;
        let set = KeySet::try_new(vec!["id".into()], &[keys])?;
        for (path, size) in &files {
            let (marks, _) = superseded_rows(&store, path, *size, &set).await?;
            assert_eq!(marks.iter().collect::<Vec<_>>(), vec![1_500, 1_999, 17_000]);
            let builder =
                ParquetRecordBatchStreamBuilder::new(TailReader::new(&store, path, *size)).await?;
            let groups: Vec<usize> = probed_groups(&store, path, *size, builder.metadata(), &set)
                .await?
                .into_iter()
                .map(|(g, _)| g)
                .collect();
            if path.as_ref() == "wide.parquet" {
                // groups 1 and 17, and at most a few false positives of 20
                assert!(groups.contains(&1) && groups.contains(&17), "{groups:?}");
                assert!(groups.len() <= 5, "{groups:?}");
            } else {
                assert_eq!(groups.len(), 20);
            }
        }
        Ok(())
    }

    /// A Parquet file `<name>.parquet` in `store` of one column `id`, a row
    /// group per array of `groups`, in pages of 1 000 rows, with a bloom
    /// filter on `id` (0.1 % false positives) if `bloom`.
    async fn put_row_groups(
        store: &Arc<dyn ObjectStore>,
        name: &str,
        groups: Vec<ArrayRef>,
        bloom: bool,
    ) -> Result<(Path, u64, SchemaRef)> {
        use deltalake_core::parquet::arrow::ArrowWriter;
        use deltalake_core::parquet::file::properties::WriterProperties;
        use deltalake_core::parquet::schema::types::ColumnPath;

        let data_type = groups
            .first()
            .map_or(DataType::Int64, |g| g.data_type().clone());
        let schema = Arc::new(Schema::new(vec![Field::new("id", data_type, false)]));
        let properties = WriterProperties::builder()
            .set_max_row_group_row_count(None)
            .set_data_page_row_count_limit(1_000)
            .set_write_batch_size(1_000)
            .set_column_bloom_filter_enabled(ColumnPath::from("id"), bloom)
            .set_column_bloom_filter_fpp(ColumnPath::from("id"), 0.001)
            .build();
        let mut bytes = Vec::new();
        let mut writer = ArrowWriter::try_new(&mut bytes, Arc::clone(&schema), Some(properties))?;
        for group in groups {
            writer.write(&RecordBatch::try_new(Arc::clone(&schema), vec![group])?)?;
            writer.flush()?;
        }
        writer.close()?;
        let (path, size) = (Path::from(format!("{name}.parquet")), bytes.len() as u64);
        store.put(&path, PutPayload::from(bytes)).await?;
        Ok((path, size, schema))
    }

    /// In a row group sorted by key, only the pages whose minimum and
    /// maximum bracket a key are read (keys at page edges included); a row
    /// group in no order is read whole; the positions found are exact.
    #[tokio::test]
    async fn sorted_row_groups_are_probed_only_in_the_pages_of_the_keys() -> Result<()> {
        let store: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
        // row group 0: 0..20 000 in order; row group 1: 20 000..22 000
        // scattered (every page spans nearly all of them)
        let sorted = Int64Array::from_iter_values(0..20_000);
        let scattered = Int64Array::from_iter_values((0..2_000).map(|i| 20_000 + (i * 7) % 2_000));
        let (path, size, schema) = put_row_groups(
            &store,
            "sorted",
            vec![Arc::new(sorted), Arc::new(scattered)],
            false,
        )
        .await?;

        let keys = RecordBatch::try_new(
            Arc::clone(&schema),
            vec![Arc::new(Int64Array::from(vec![
                999, 1_000, 5_500, 19_999, 20_500,
            ]))],
        )?;
        let set = KeySet::try_new(vec!["id".into()], &[keys])?;
        let (marks, metadata) = superseded_rows(&store, &path, size, &set).await?;
        // 20 500 is row 1 500 of row group 1 (1 500 · 7 = 500 mod 2 000)
        assert_eq!(
            marks.iter().collect::<Vec<_>>(),
            vec![999, 1_000, 5_500, 19_999, 21_500]
        );
        let (spans, selection) = rows_to_probe(
            metadata.metadata(),
            &[(0, None), (1, None)],
            first_leaf(&metadata, &set),
            &set,
        );
        assert_eq!(
            spans,
            vec![(0, 2_000), (5_000, 1_000), (19_000, 3_000)],
            "pages 0, 1, 5 and 19 of row group 0, all of row group 1"
        );
        assert_eq!(selection.map(|s| s.row_count()), Some(6_000));
        Ok(())
    }

    /// String keys: pages are skipped by their byte-wise minimum and maximum.
    #[tokio::test]
    async fn sorted_string_keys_are_probed_only_in_their_pages() -> Result<()> {
        use arrow::array::StringArray;

        let store: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
        let ids = StringArray::from_iter_values((0..20_000).map(|i| format!("k{i:05}")));
        let (path, size, schema) =
            put_row_groups(&store, "strings", vec![Arc::new(ids)], false).await?;
        let keys = RecordBatch::try_new(
            Arc::clone(&schema),
            vec![Arc::new(StringArray::from(vec!["k00999", "k05500", "x"]))],
        )?;
        let set = KeySet::try_new(vec!["id".into()], &[keys])?;
        let (marks, metadata) = superseded_rows(&store, &path, size, &set).await?;
        assert_eq!(marks.iter().collect::<Vec<_>>(), vec![999, 5_500]);
        let (spans, _) = rows_to_probe(
            metadata.metadata(),
            &[(0, None)],
            first_leaf(&metadata, &set),
            &set,
        );
        assert_eq!(spans, vec![(0, 1_000), (5_000, 1_000)]);
        Ok(())
    }

    /// Two sorted row groups spanning the same range (even ids, odd ids):
    /// each is read only in the page of the key its bloom filter admits, not
    /// in the pages of keys that only the other row group holds.
    #[tokio::test]
    async fn each_row_group_is_probed_for_the_keys_its_filter_admits() -> Result<()> {
        let store: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
        let groups: Vec<ArrayRef> = [0, 1]
            .into_iter()
            .map(|parity| {
                Arc::new(Int64Array::from_iter_values(
                    (0..10_000).map(|i| 2 * i + parity),
                )) as ArrayRef
            })
            .collect();
        let (path, size, schema) = put_row_groups(&store, "interleaved", groups, true).await?;
        // 100: row 50 of group 0 (page 0); 15 001: row 7 500 of group 1 (page 7)
        let keys = RecordBatch::try_new(
            Arc::clone(&schema),
            vec![Arc::new(Int64Array::from(vec![100, 15_001]))],
        )?;
        let set = KeySet::try_new(vec!["id".into()], &[keys])?;
        let (marks, metadata) = superseded_rows(&store, &path, size, &set).await?;
        assert_eq!(marks.iter().collect::<Vec<_>>(), vec![50, 17_500]);
        let groups = probed_groups(&store, &path, size, metadata.metadata(), &set).await?;
        assert_eq!(groups, vec![(0, Some(vec![0])), (1, Some(vec![1]))]);
        let (spans, _) = rows_to_probe(
            metadata.metadata(),
            &groups,
            first_leaf(&metadata, &set),
            &set,
        );
        assert_eq!(spans, vec![(0, 1_000), (17_000, 1_000)]);
        Ok(())
    }

    #[test]
    fn key_sets_mark_rows_of_any_key_type() -> Result<()> {
        let schema = Arc::new(Schema::new(vec![
            Field::new("id", DataType::Int64, false),
            Field::new("name", DataType::Utf8, false),
        ]));
        let keys = RecordBatch::try_new(
            Arc::clone(&schema),
            vec![
                Arc::new(Int64Array::from(vec![1, 2])),
                Arc::new(StringArray::from(vec!["a", "b"])),
            ],
        )?;
        let set = KeySet::try_new(vec!["id".into(), "name".into()], &[keys])?;
        assert_eq!(set.len(), 2);
        let ids: ArrayRef = Arc::new(Int64Array::from(vec![1, 1, 2, 3]));
        let names: ArrayRef = Arc::new(StringArray::from(vec!["a", "b", "b", "a"]));
        let mut marks = RoaringTreemap::new();
        set.mark(&[ids, names], 10, &mut Vec::new(), &mut marks)?;
        assert_eq!(marks.iter().collect::<Vec<_>>(), vec![10, 12]);
        Ok(())
    }

    /// The hash test only preselects: across batches (one scratch buffer),
    /// exactly the members are marked, NULL and -0.0 included, and a value
    /// equal to a member in one column only is not.
    #[test]
    fn key_sets_mark_exactly_the_members_across_batches() -> Result<()> {
        use arrow::array::Float64Array;
        let schema = Arc::new(Schema::new(vec![
            Field::new("k", DataType::Float64, true),
            Field::new("n", DataType::Int64, false),
        ]));
        let members: Vec<(Option<f64>, i64)> = vec![
            (Some(-0.0), 1),
            (None, 2),
            (Some(3.5), 3),
            (Some(f64::NAN), 4),
        ];
        let keys = RecordBatch::try_new(
            Arc::clone(&schema),
            vec![
                Arc::new(members.iter().map(|m| m.0).collect::<Float64Array>()),
                Arc::new(members.iter().map(|m| m.1).collect::<Int64Array>()),
            ],
        )?;
        let set = KeySet::try_new(vec!["k".into(), "n".into()], &[keys])?;
        // 3 batches of 1000 rows: the members among many non-members
        let probe = |i: i64| -> (Option<f64>, i64) {
            match i % 250 {
                7 => (Some(-0.0), 1),
                8 => (Some(0.0), 1),
                9 => (None, 2),
                10 => (None, 3),
                11 => (Some(3.5), 3),
                12 => (Some(f64::NAN), 4),
                _ => (Some(i as f64), i),
            }
        };
        let (mut marks, mut scratch) = (RoaringTreemap::new(), Vec::new());
        for b in 0..3i64 {
            let rows: Vec<_> = (b * 1000..(b + 1) * 1000).map(probe).collect();
            let columns: Vec<ArrayRef> = vec![
                Arc::new(rows.iter().map(|r| r.0).collect::<Float64Array>()),
                Arc::new(rows.iter().map(|r| r.1).collect::<Int64Array>()),
            ];
            set.mark(&columns, (b * 1000) as u64, &mut scratch, &mut marks)?;
        }
        let expected: Vec<u64> = (0..3000u64)
            .filter(|i| [7, 9, 11, 12].contains(&(i % 250)))
            .collect();
        assert_eq!(marks.iter().collect::<Vec<_>>(), expected);
        Ok(())
    }
}
