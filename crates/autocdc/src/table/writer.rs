//! Writes the rows of an update into Parquet data files, one file series per
//! key bucket (`__cdc_bucket=<b>/part-<uuid>.parquet`), and describes them as
//! Delta `Add` actions for the commit.
//!
//! Written directly with the `parquet` crate on the table's object store (the
//! store deltalake itself uses), so the files of an update can carry a new
//! table schema that commits together with them.
//!
//! A state file holds either only visible rows (live rows, SCD 2 versions)
//! or only hidden ones (tombstones, hidden events, the truncate watermark),
//! and its `Add` says which in the tag [`ROWS_TAG`]: the published table adds
//! the first kind as they are and leaves the second out, without reading
//! either ([`super::published`]).
//!
//! Data files are clustered by key: each row group's rows are sorted by the
//! key columns before they are written, in data pages of [`PAGE_ROWS`] rows,
//! so that the page index's minimum and maximum key of a page are close and
//! a small update's probe and pre-image read decode the few pages that may
//! hold its keys rather than whole row groups
//! ([`super::deletion_vectors::superseded_rows`]). A row group whose rows
//! arrived in key order (an index-sorted fold routed by bucket emits each
//! bucket's rows so, `crate::physical::key_exchange`) is only concatenated,
//! not sorted and gathered (a single integer, date or timestamp key is
//! checked as rows arrive; other keys are always sorted).

use std::collections::BTreeMap;
use std::ops::Range;
use std::sync::Arc;

use arrow::array::{Array, Int32Array, RecordBatch, UInt32Array};
use arrow::array::{ArrowPrimitiveType, AsArray};
use arrow::compute::{
    concat, concat_batches, interleave_record_batch, lexsort_to_indices, sort_to_indices,
    take_record_batch, SortColumn,
};
use arrow::datatypes::{
    DataType, Date32Type, Date64Type, Int16Type, Int32Type, Int64Type, Int8Type, SchemaRef,
    TimeUnit, TimestampMicrosecondType, TimestampMillisecondType, TimestampNanosecondType,
    TimestampSecondType, UInt16Type, UInt32Type, UInt64Type, UInt8Type,
};
use datafusion::common::{DataFusionError, Result};
use datafusion::execution::cache::cache_manager::FileMetadataCache;
use deltalake_core::kernel::Add;
use deltalake_core::parquet::arrow::async_writer::AsyncArrowWriter;
use deltalake_core::parquet::basic::{Compression, ZstdLevel};
use deltalake_core::parquet::file::properties::{BloomFilterPosition, WriterProperties};
use deltalake_core::parquet::schema::types::ColumnPath;
use object_store::buffered::BufWriter;
use object_store::path::Path;
use object_store::{ObjectStore, ObjectStoreExt};

use super::bucket::BUCKET_COL;
use super::file_tail::TailCapture;
use super::key_bloom::{bloom_column, BLOOM_FPP};
use super::probe_index::{written_index, CachedIndex};

/// Rows per Parquet row group.
const ROW_GROUP_ROWS: usize = 64 * 1024;
/// Encoded bytes per Parquet row group. Every open bucket file buffers one
/// row group (outside DataFusion's memory pool), so this bounds the writer's
/// memory at about `2 × buckets × (ROW_GROUP_BYTES + UPLOAD_BUFFER_BYTES)`.
const ROW_GROUP_BYTES: usize = 8 * 1024 * 1024;

/// Rows per data page (at most): the unit a key probe or a read of a few
/// rows by position decodes.
const PAGE_ROWS: usize = 8 * 1024;

/// Slices of input batches a bucket holds before it copies them into one
/// batch of its own (so that it keeps few input batches alive) ...
const PENDING_SLICES: usize = 32;

/// ... or sooner, once the batches they are slices of hold this many bytes
/// (a few rows of each of many batches, such as an SCD 2 update's hidden
/// events, would keep every one of those batches alive).
const PENDING_SLICED_BYTES: usize = 32 * 1024 * 1024;

/// Bytes buffered per file before an upload part is sent (5 MiB: the least
/// part size object stores accept).
const UPLOAD_BUFFER_BYTES: usize = 5 * 1024 * 1024;

/// Bytes after which a bucket's file is closed and a new one started.
const TARGET_FILE_BYTES: usize = 128 * 1024 * 1024;

/// Tag of a state file's `Add`: which rows the file holds ([`FileRows`]).
pub const ROWS_TAG: &str = "autocdc.rows";

/// What the rows of a written file are.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FileRows {
    /// State rows that `SELECT *` shows: live rows, SCD 2 / BITEMPORAL versions.
    Visible,
    /// State rows it does not show: tombstones, hidden events, the truncate watermark.
    Hidden,
    /// Change data feed rows (`_change_data/`).
    Changes,
}

impl FileRows {
    /// Value of [`ROWS_TAG`] for state files.
    fn tag(self) -> Option<&'static str> {
        match self {
            Self::Visible => Some("visible"),
            Self::Hidden => Some("hidden"),
            Self::Changes => None,
        }
    }

    /// What a state file holds, by its tag (`None`: a file written before
    /// files were tagged, which may hold both kinds).
    pub fn of(add: &Add) -> Option<Self> {
        let tag = add.tags.as_ref()?.get(ROWS_TAG)?.as_deref()?;
        [Self::Visible, Self::Hidden]
            .into_iter()
            .find(|rows| rows.tag() == Some(tag))
    }
}

/// How data and change files are compressed: the table property
/// [`COMPRESSION_PROPERTY`](super::properties::COMPRESSION_PROPERTY).
///
/// zstd gives the smallest files; LZ4 (Parquet `LZ4_RAW`) files are about
/// half as large again but decode several times faster and open no codec
/// contexts, which is most of a small update's and a scan's work
/// (`benches/README.md`); Snappy is the codec every Parquet reader knows.
#[derive(
    Debug,
    Clone,
    Copy,
    Default,
    PartialEq,
    Eq,
    Hash,
    PartialOrd,
    serde::Serialize,
    serde::Deserialize,
)]
#[serde(rename_all = "lowercase")]
pub enum FileCompression {
    /// zstd, level 1.
    #[default]
    Zstd,
    /// LZ4 in Parquet's `LZ4_RAW` framing.
    Lz4,
    /// Snappy.
    Snappy,
}

impl FileCompression {
    /// Every codec, as the property names them.
    pub const ALL: [Self; 3] = [Self::Zstd, Self::Lz4, Self::Snappy];

    /// The codec the property value `value` names (any case).
    pub fn parse(value: &str) -> Option<Self> {
        Self::ALL
            .into_iter()
            .find(|c| c.name().eq_ignore_ascii_case(value.trim()))
    }

    /// The property value naming this codec.
    pub fn name(self) -> &'static str {
        match self {
            Self::Zstd => "zstd",
            Self::Lz4 => "lz4",
            Self::Snappy => "snappy",
        }
    }

    fn parquet(self) -> Compression {
        match self {
            Self::Zstd => Compression::ZSTD(ZstdLevel::default()),
            Self::Lz4 => Compression::LZ4_RAW,
            Self::Snappy => Compression::SNAPPY,
        }
    }
}

fn io_err(e: impl std::error::Error + Send + Sync + 'static) -> DataFusionError {
    DataFusionError::External(Box::new(e))
}

struct OpenFile {
    path: Path,
    writer: AsyncArrowWriter<TailCapture<BufWriter>>,
    rows: usize,
    /// Rows of the row group being gathered (sorted files only).
    pending: Vec<RecordBatch>,
    pending_rows: usize,
    pending_bytes: usize,
    /// How many of the last batches held are slices of input batches (the
    /// others are copies of their own), and the bytes of the batches they
    /// are slices of.
    slices: usize,
    sliced_bytes: usize,
    /// Whether the rows held came in key order, and the last key held
    /// (`None`: they did not, or the key is not checked).
    in_order: Option<InOrder>,
}

/// Where the rows held so far in key order stand.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum InOrder {
    /// No row held yet.
    Empty,
    /// The last key held.
    Last(i128),
}

impl InOrder {
    /// The state of a row group not started, sorted by the columns `keys`
    /// (`None`: their order is not checked, one key is).
    fn start(keys: &[usize]) -> Option<Self> {
        (keys.len() == 1).then_some(Self::Empty)
    }
}

impl OpenFile {
    /// Hold `part` for the row group being gathered (`keys`: the columns
    /// it is sorted by).
    fn hold(&mut self, part: RecordBatch, keys: &[usize]) -> Result<()> {
        self.follow_order(&part, keys);
        self.pending_rows += part.num_rows();
        self.pending_bytes += part
            .columns()
            .iter()
            .map(|c| c.to_data().get_slice_memory_size())
            .sum::<std::result::Result<usize, _>>()?;
        self.sliced_bytes += part.get_array_memory_size();
        self.pending.push(part);
        self.slices += 1;
        if self.slices >= PENDING_SLICES || self.sliced_bytes >= PENDING_SLICED_BYTES {
            // (the slices held since the last copy: each row is copied once)
            let slices = self.pending.split_off(self.pending.len() - self.slices);
            self.pending
                .push(concat_batches(&slices[0].schema(), &slices)?);
            (self.slices, self.sliced_bytes) = (0, 0);
        }
        Ok(())
    }

    /// Note whether `part` continues the rows held in key order.
    fn follow_order(&mut self, part: &RecordBatch, keys: &[usize]) {
        let (Some(in_order), [key]) = (self.in_order, keys) else {
            return;
        };
        self.in_order = match (in_order, ascending_range(part.column(*key).as_ref())) {
            (InOrder::Empty, Some((_, last))) => Some(InOrder::Last(last)),
            (InOrder::Last(before), Some((first, last))) if before <= first => {
                Some(InOrder::Last(last))
            }
            _ => None,
        };
    }

    /// Write the rows held as one row group, sorted by the columns `keys`.
    async fn write_held(&mut self, keys: &[usize]) -> Result<()> {
        let held = std::mem::take(&mut self.pending);
        (self.pending_rows, self.pending_bytes) = (0, 0);
        (self.slices, self.sliced_bytes) = (0, 0);
        let in_order = std::mem::replace(&mut self.in_order, InOrder::start(keys));
        if held.is_empty() {
            return Ok(());
        }
        let order = match in_order {
            Some(_) => None,
            None => key_order(&held, keys),
        };
        let rows = match order {
            Some(order) => gather(&held, &order)?,
            // in key order already, or keys no sort kernel orders: the rows
            // as they came
            None => concat_batches(&held[0].schema(), &held)?,
        };
        self.writer.write(&rows).await?;
        self.writer.flush().await?;
        Ok(())
    }
}

/// The first and last key of `column` when it holds no null and its values
/// do not decrease; `None` otherwise, or for a type not checked (see the
/// module docs).
fn ascending_range(column: &dyn Array) -> Option<(i128, i128)> {
    fn range<T: ArrowPrimitiveType>(column: &dyn Array) -> Option<(i128, i128)>
    where
        T::Native: Into<i128>,
    {
        let values = column.as_primitive_opt::<T>()?.values();
        let ascending = values.windows(2).all(|w| w[0] <= w[1]);
        match (ascending, values.first(), values.last()) {
            (true, Some(first), Some(last)) => Some(((*first).into(), (*last).into())),
            _ => None,
        }
    }
    if column.null_count() > 0 {
        return None;
    }
    match column.data_type() {
        DataType::Int8 => range::<Int8Type>(column),
        DataType::Int16 => range::<Int16Type>(column),
        DataType::Int32 => range::<Int32Type>(column),
        DataType::Int64 => range::<Int64Type>(column),
        DataType::UInt8 => range::<UInt8Type>(column),
        DataType::UInt16 => range::<UInt16Type>(column),
        DataType::UInt32 => range::<UInt32Type>(column),
        DataType::UInt64 => range::<UInt64Type>(column),
        DataType::Date32 => range::<Date32Type>(column),
        DataType::Date64 => range::<Date64Type>(column),
        DataType::Timestamp(TimeUnit::Second, _) => range::<TimestampSecondType>(column),
        DataType::Timestamp(TimeUnit::Millisecond, _) => range::<TimestampMillisecondType>(column),
        DataType::Timestamp(TimeUnit::Microsecond, _) => range::<TimestampMicrosecondType>(column),
        DataType::Timestamp(TimeUnit::Nanosecond, _) => range::<TimestampNanosecondType>(column),
        _ => None,
    }
}

/// The order of the rows of `batches` (positions in their concatenation)
/// by the columns `keys`, nulls first as the row format orders them; `None`
/// when Arrow's sort kernels do not order the keys' types.
fn key_order(batches: &[RecordBatch], keys: &[usize]) -> Option<UInt32Array> {
    let key_column = |k: usize| {
        let parts: Vec<&dyn Array> = batches.iter().map(|b| b.column(k).as_ref()).collect();
        concat(&parts)
    };
    match keys {
        [key] => sort_to_indices(&key_column(*key).ok()?, None, None).ok(),
        _ => {
            let columns = keys
                .iter()
                .map(|&k| {
                    Some(SortColumn {
                        values: key_column(k).ok()?,
                        options: None,
                    })
                })
                .collect::<Option<Vec<_>>>()?;
            lexsort_to_indices(&columns, None).ok()
        }
    }
}

/// The rows of `batches` at the positions `order` of their concatenation,
/// in one batch.
fn gather(batches: &[RecordBatch], order: &UInt32Array) -> Result<RecordBatch> {
    let mut starts = Vec::with_capacity(batches.len());
    let mut start = 0;
    for batch in batches {
        starts.push(start);
        start += batch.num_rows();
    }
    // each position as (batch, row): the last batch starting at or before it
    let places: Vec<(usize, usize)> = order
        .values()
        .iter()
        .map(|&i| {
            let i = i as usize;
            let b = starts.partition_point(|&s| s <= i).saturating_sub(1);
            (b, i - starts[b])
        })
        .collect();
    let sources: Vec<&RecordBatch> = batches.iter().collect();
    Ok(interleave_record_batch(&sources, &places)?)
}

/// Bucketed Parquet writer of one update.
pub struct BucketWriter {
    store: Arc<dyn ObjectStore>,
    /// What the files hold (change files go to `_change_data/`).
    rows: FileRows,
    schema: SchemaRef,
    /// Key columns given a bloom filter ([`super::key_bloom`]).
    bloom_columns: Vec<String>,
    /// Key columns each row group is sorted by (data files; none: rows are
    /// written in the order they come).
    sort_keys: Vec<usize>,
    compression: FileCompression,
    /// Where what a probe needs of each data file goes, if anywhere.
    index_cache: Option<Arc<FileMetadataCache>>,
    /// The key columns in table order, as probes name them.
    key_names: Vec<String>,
    open: BTreeMap<i32, OpenFile>,
    adds: Vec<Add>,
}

impl std::fmt::Debug for BucketWriter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BucketWriter")
            .field("open", &self.open.len())
            .field("adds", &self.adds.len())
            .finish()
    }
}

/// Whether equal buckets are adjacent (non-decreasing: runs of one bucket).
fn is_grouped(buckets: &[i32]) -> bool {
    buckets.windows(2).all(|w| w[0] <= w[1])
}

/// The rows of `batch` and their `buckets`, reordered (one copy, stable) so
/// that rows of equal `group(bucket)`, then of equal bucket, are adjacent.
pub fn group_by_bucket(
    batch: &RecordBatch,
    buckets: &Int32Array,
    group: impl Fn(i32) -> i32,
) -> Result<(RecordBatch, Int32Array)> {
    let values = buckets.values();
    let mut order: Vec<u32> = (0..values.len() as u32).collect();
    order.sort_by_key(|&i| {
        let b = values[i as usize];
        (group(b), b)
    });
    let grouped = Int32Array::from_iter_values(order.iter().map(|&i| values[i as usize]));
    let order = UInt32Array::from(order);
    Ok((take_record_batch(batch, &order)?, grouped))
}

/// The runs of equal values of grouped `buckets`: (bucket, row range).
fn bucket_runs(buckets: &[i32]) -> impl Iterator<Item = (i32, Range<usize>)> + '_ {
    let mut start = 0;
    std::iter::from_fn(move || {
        let bucket = *buckets.get(start)?;
        let len = buckets[start..]
            .iter()
            .position(|b| *b != bucket)
            .unwrap_or(buckets.len() - start);
        let run = (bucket, start..start + len);
        start += len;
        Some(run)
    })
}

impl BucketWriter {
    /// A writer of `rows` with `schema` into the table rooted at `store`.
    pub fn new(store: Arc<dyn ObjectStore>, schema: SchemaRef, rows: FileRows) -> Self {
        Self {
            store,
            rows,
            schema,
            bloom_columns: Vec::new(),
            sort_keys: Vec::new(),
            compression: FileCompression::default(),
            index_cache: None,
            key_names: Vec::new(),
            open: BTreeMap::new(),
            adds: Vec::new(),
        }
    }

    /// Give the key columns `key_indices` of data files (not change files)
    /// a bloom filter per row group, when their type has one
    /// (`super::key_bloom`): small updates probe only the row groups that
    /// may hold their keys; and sort each row group of data files by them
    /// (see the module docs).
    pub fn with_key_filters(mut self, key_indices: &[usize]) -> Self {
        if self.rows != FileRows::Changes {
            self.sort_keys = key_indices.to_vec();
            let mut positions = key_indices.to_vec();
            positions.sort_unstable();
            self.key_names = positions
                .iter()
                .map(|&i| self.schema.field(i).name().clone())
                .collect();
            self.bloom_columns = key_indices
                .iter()
                .map(|&i| self.schema.field(i))
                .filter(|f| bloom_column(f.data_type()))
                .map(|f| f.name().clone())
                .collect();
        }
        self
    }

    /// Put what a probe for keys needs of each data file written (its
    /// metadata, page index and key filters) in `cache`, the session's file
    /// metadata cache ([`super::probe_index`]).
    pub fn with_index_cache(mut self, cache: Option<Arc<FileMetadataCache>>) -> Self {
        if self.rows != FileRows::Changes {
            self.index_cache = cache;
        }
        self
    }

    /// Compress the files with `compression` (default: zstd).
    pub fn with_compression(mut self, compression: FileCompression) -> Self {
        self.compression = compression;
        self
    }

    /// Folder of the files inside the table.
    fn folder(&self) -> &'static str {
        match self.rows {
            FileRows::Changes => "_change_data/",
            FileRows::Visible | FileRows::Hidden => "",
        }
    }

    /// Parquet settings of the data and change files.
    ///
    /// Small row groups: every bucket being written buffers one in memory.
    /// No dictionary encoding: interning every value was the largest part of
    /// writing an update, and on the benchmark data (keys, sequences, numbers
    /// and strings of every cardinality) zstd over plain values gave smaller
    /// files too (10 M events, SCD 1: 14.5 s → 9.8 s, 181 → 132 MB).
    fn properties(&self) -> WriterProperties {
        let mut builder = WriterProperties::builder()
            .set_compression(self.compression.parquet())
            .set_max_row_group_row_count(Some(ROW_GROUP_ROWS))
            .set_max_row_group_bytes(Some(ROW_GROUP_BYTES))
            .set_data_page_row_count_limit(PAGE_ROWS)
            .set_dictionary_enabled(false)
            .set_bloom_filter_position(BloomFilterPosition::End);
        for name in &self.bloom_columns {
            let column = ColumnPath::from(name.as_str());
            builder = builder
                .set_column_bloom_filter_enabled(column.clone(), true)
                .set_column_bloom_filter_max_ndv(column.clone(), ROW_GROUP_ROWS as u64)
                .set_column_bloom_filter_fpp(column, BLOOM_FPP);
        }
        builder.build()
    }

    /// Write `batch`, whose row `i` belongs to bucket `buckets[i]`.
    ///
    /// Rows already grouped by bucket (as [`group_by_bucket`] leaves them)
    /// are written as slices; others are grouped first, with one copy.
    pub async fn write(&mut self, batch: &RecordBatch, buckets: &Int32Array) -> Result<()> {
        if batch.num_rows() == 0 {
            return Ok(());
        }
        let (batch, buckets) = if is_grouped(buckets.values()) {
            (batch.clone(), buckets.clone())
        } else {
            group_by_bucket(batch, buckets, |b| b)?
        };
        for (bucket, range) in bucket_runs(buckets.values()) {
            let part = batch.slice(range.start, range.len());
            let part = RecordBatch::try_new(Arc::clone(&self.schema), part.columns().to_vec())?;
            if !self.open.contains_key(&bucket) {
                let path = Path::from(format!(
                    "{}{BUCKET_COL}={bucket}/part-{}.{}.parquet",
                    self.folder(),
                    uuid::Uuid::new_v4(),
                    self.compression.name()
                ));
                let writer = AsyncArrowWriter::try_new(
                    TailCapture::new(BufWriter::with_capacity(
                        Arc::clone(&self.store),
                        path.clone(),
                        UPLOAD_BUFFER_BYTES,
                    )),
                    Arc::clone(&self.schema),
                    Some(self.properties()),
                )?;
                self.open.insert(
                    bucket,
                    OpenFile {
                        path,
                        writer,
                        rows: 0,
                        pending: Vec::new(),
                        pending_rows: 0,
                        pending_bytes: 0,
                        slices: 0,
                        sliced_bytes: 0,
                        in_order: InOrder::start(&self.sort_keys),
                    },
                );
            }
            let file = self
                .open
                .get_mut(&bucket)
                .ok_or_else(|| DataFusionError::Internal("lost writer".into()))?;
            file.rows += part.num_rows();
            if self.sort_keys.is_empty() {
                file.writer.write(&part).await?;
            } else {
                // a row group's worth at a time, sorted
                let mut part = part;
                loop {
                    let room = ROW_GROUP_ROWS - file.pending_rows;
                    let take = part.num_rows().min(room);
                    file.hold(part.slice(0, take), &self.sort_keys)?;
                    if file.pending_rows >= ROW_GROUP_ROWS || file.pending_bytes >= ROW_GROUP_BYTES
                    {
                        file.write_held(&self.sort_keys).await?;
                    }
                    if take == part.num_rows() {
                        break;
                    }
                    part = part.slice(take, part.num_rows() - take);
                }
            }
            if file.writer.bytes_written() + file.writer.in_progress_size() >= TARGET_FILE_BYTES {
                if let Some(file) = self.open.remove(&bucket) {
                    self.close(bucket, file).await?;
                }
            }
        }
        Ok(())
    }

    async fn close(&mut self, bucket: i32, file: OpenFile) -> Result<()> {
        let add = self.closing().close(bucket, file).await?;
        self.adds.push(add);
        Ok(())
    }

    /// What closing a file needs of this writer.
    fn closing(&self) -> Closing<'_> {
        Closing {
            rows: self.rows,
            sort_keys: &self.sort_keys,
            key_names: &self.key_names,
            index_cache: self.index_cache.as_ref(),
        }
    }

    /// Close every open file; returns the `Add` actions of all written files.
    pub async fn finish(mut self) -> Result<Vec<Add>> {
        let open = std::mem::take(&mut self.open);
        // (the files' last uploads wait for the store together: one round
        // trip, not one per bucket)
        let closing = self.closing();
        let closed =
            futures::future::try_join_all(open.into_iter().map(|(b, f)| closing.close(b, f)))
                .await?;
        self.adds.extend(closed);
        Ok(self.adds)
    }

    /// Delete files written but not committed.
    pub async fn discard(store: &Arc<dyn ObjectStore>, adds: &[Add]) -> Result<()> {
        for add in adds {
            store
                .delete(&Path::from(add.path.as_str()))
                .await
                .map_err(io_err)?;
        }
        Ok(())
    }
}

/// What closing a file needs of its [`BucketWriter`] (shared by the files
/// closed together).
#[derive(Clone, Copy)]
struct Closing<'a> {
    rows: FileRows,
    sort_keys: &'a [usize],
    key_names: &'a [String],
    index_cache: Option<&'a Arc<FileMetadataCache>>,
}

impl Closing<'_> {
    /// Write the rest of `file`, the file of `bucket`, and upload it; its
    /// `add`.
    async fn close(&self, bucket: i32, mut file: OpenFile) -> Result<Add> {
        file.write_held(self.sort_keys).await?;
        file.writer.finish().await?;
        // (the writer counted the bytes it uploaded: no request to ask the
        // store the size)
        let size = file.writer.bytes_written();
        let modified = chrono::Utc::now().timestamp_millis();
        if let (Some(cache), false) = (self.index_cache, self.key_names.is_empty()) {
            // (what a probe of the file needs, from the tail just written)
            let tail = file.writer.into_inner().tail();
            if let Some(index) = written_index(&tail, self.key_names) {
                CachedIndex::of_file(cache.as_ref(), file.path.clone(), size as u64, modified)
                    .put(index);
            }
        }
        Ok(Add {
            path: file.path.to_string(),
            partition_values: [(BUCKET_COL.to_string(), Some(bucket.to_string()))]
                .into_iter()
                .collect(),
            size: i64::try_from(size).map_err(|_| {
                DataFusionError::Internal(format!("file '{}' of {size} bytes", file.path))
            })?,
            modification_time: modified,
            data_change: true,
            stats: Some(format!("{{\"numRecords\":{}}}", file.rows)),
            tags: self
                .rows
                .tag()
                .map(|tag| [(ROWS_TAG.to_string(), Some(tag.to_string()))].into()),
            ..Default::default()
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use arrow::array::{AsArray, Int64Array};
    use arrow::datatypes::{DataType, Field, Int64Type, Schema};

    /// Each codec the table property names compresses every column of data
    /// and change files, names the files, and reads back the rows written.
    #[tokio::test]
    async fn files_are_compressed_with_the_tables_codec() -> Result<()> {
        use deltalake_core::parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;
        use object_store::memory::InMemory;

        assert_eq!(FileCompression::parse("LZ4"), Some(FileCompression::Lz4));
        assert_eq!(
            FileCompression::parse(" snappy "),
            Some(FileCompression::Snappy)
        );
        assert_eq!(FileCompression::parse("gzip"), None);
        let schema = Arc::new(Schema::new(vec![
            Field::new("id", DataType::Int64, false),
            Field::new("name", DataType::Utf8, true),
        ]));
        let batch = RecordBatch::try_new(
            Arc::clone(&schema),
            vec![
                Arc::new(Int64Array::from_iter_values(0..1_000)),
                Arc::new(arrow::array::StringArray::from_iter(
                    (0..1_000).map(|i| (i % 3 != 0).then(|| format!("name {i}"))),
                )),
            ],
        )?;
        let buckets = Int32Array::from_iter_values((0..1_000).map(|i| i % 2));
        for (compression, parquet) in [
            (
                FileCompression::default(),
                Compression::ZSTD(ZstdLevel::default()),
            ),
            (FileCompression::Lz4, Compression::LZ4_RAW),
            (FileCompression::Snappy, Compression::SNAPPY),
        ] {
            let store: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
            let mut adds = Vec::new();
            for rows in [FileRows::Visible, FileRows::Changes] {
                let mut writer = BucketWriter::new(Arc::clone(&store), Arc::clone(&schema), rows)
                    .with_key_filters(&[0])
                    .with_compression(compression);
                writer.write(&batch, &buckets).await?;
                adds.extend(writer.finish().await?);
            }
            assert_eq!(adds.len(), 4, "{compression:?}: two buckets, two kinds");
            let mut ids = Vec::new();
            for add in adds {
                let suffix = format!(".{}.parquet", compression.name());
                assert!(add.path.ends_with(&suffix), "{}", add.path);
                let bytes = file_bytes(&store, &add).await?;
                assert_eq!(
                    add.size,
                    bytes.len() as i64,
                    "{}: the size uploaded",
                    add.path
                );
                let builder = ParquetRecordBatchReaderBuilder::try_new(bytes)?;
                for group in builder.metadata().row_groups() {
                    for column in group.columns() {
                        assert_eq!(column.compression(), parquet, "{}", add.path);
                    }
                }
                for b in builder.build()? {
                    ids.extend(b?.column(0).as_primitive::<Int64Type>().values().to_vec());
                }
            }
            ids.sort_unstable();
            let twice: Vec<i64> = (0..1_000).flat_map(|i| [i, i]).collect();
            assert_eq!(
                ids, twice,
                "{compression:?}: every row in data and change files"
            );
        }
        Ok(())
    }

    /// The bytes of the file `add` names.
    async fn file_bytes(store: &Arc<dyn ObjectStore>, add: &Add) -> Result<bytes::Bytes> {
        Ok(store
            .get(&Path::from(add.path.as_str()))
            .await?
            .bytes()
            .await?)
    }

    /// The schema of [`id_batches`]: `v`, then the key `id`.
    fn v_id_schema() -> SchemaRef {
        Arc::new(Schema::new(vec![
            Field::new("v", DataType::Int64, false),
            Field::new("id", DataType::Int64, false),
        ]))
    }

    /// Batches of `(v, id)` rows, `v = 2 × id`, of `chunk` of `ids` each,
    /// with each row's bucket `bucket(id)`.
    fn id_batches(
        schema: &SchemaRef,
        ids: &[i64],
        chunk: usize,
        bucket: impl Fn(i64) -> i32,
    ) -> Result<Vec<(RecordBatch, Int32Array)>> {
        ids.chunks(chunk)
            .map(|chunk| {
                let batch = RecordBatch::try_new(
                    Arc::clone(schema),
                    vec![
                        Arc::new(Int64Array::from_iter_values(chunk.iter().map(|id| id * 2))),
                        Arc::new(Int64Array::from(chunk.to_vec())),
                    ],
                )?;
                let buckets = Int32Array::from_iter_values(chunk.iter().map(|&id| bucket(id)));
                Ok((batch, buckets))
            })
            .collect()
    }

    /// The `(v, id)` rows of `batches` written from [`id_batches`].
    fn v_id_rows(batches: &[RecordBatch]) -> Vec<(i64, i64)> {
        batches
            .iter()
            .flat_map(|b| {
                let v = b.column(0).as_primitive::<Int64Type>().values().to_vec();
                let id = b.column(1).as_primitive::<Int64Type>().values().to_vec();
                v.into_iter().zip(id)
            })
            .collect()
    }

    /// A few rows of each of many batches (an SCD 2 update's hidden events)
    /// keep few of those batches alive: the slices held are copied once the
    /// batches they are slices of hold `PENDING_SLICED_BYTES`.
    #[tokio::test]
    async fn slices_held_keep_few_batches_alive() -> Result<()> {
        use object_store::memory::InMemory;

        let store: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
        let schema = v_id_schema();
        let mut hidden =
            BucketWriter::new(store, Arc::clone(&schema), FileRows::Hidden).with_key_filters(&[1]);
        // 24 batches of 4 MiB (two columns of 256 Ki rows), 2 rows of each
        let rows = 256 * 1024;
        let ids: Vec<i64> = (0..rows as i64).collect();
        let mut buffers = Vec::new();
        for b in 0..24_i64 {
            let (batch, _) = id_batches(&schema, &ids, rows, |_| 0)?
                .pop()
                .expect("a batch");
            buffers.push(batch.column(1).to_data().buffers()[0].clone());
            let two = batch.slice(2 * b as usize, 2);
            hidden.write(&two, &Int32Array::from(vec![0, 0])).await?;
        }
        let alive = buffers.iter().filter(|b| b.strong_count() > 1).count();
        let most = PENDING_SLICED_BYTES / (4 * 1024 * 1024);
        assert!(alive <= most, "{alive} batches alive (at most {most})");
        let adds = hidden.finish().await?;
        assert_eq!(adds.len(), 1);
        Ok(())
    }

    /// Data files hold every row once, each row group sorted by key, in
    /// pages of at most `PAGE_ROWS` rows; change files keep the rows' order.
    #[tokio::test]
    async fn data_files_sort_each_row_group_by_key() -> Result<()> {
        use deltalake_core::parquet::arrow::arrow_reader::{
            ArrowReaderOptions, ParquetRecordBatchReaderBuilder,
        };
        use deltalake_core::parquet::file::metadata::PageIndexPolicy;
        use object_store::memory::InMemory;

        let store: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
        let schema = v_id_schema();
        // 150 000 rows of two buckets, ids scattered (a permutation of 0..n)
        let n: i64 = 150_000;
        let ids: Vec<i64> = (0..n).map(|i| (i * 7_919) % n).collect();
        let mut data =
            BucketWriter::new(Arc::clone(&store), Arc::clone(&schema), FileRows::Visible)
                .with_key_filters(&[1]);
        let mut changes =
            BucketWriter::new(Arc::clone(&store), Arc::clone(&schema), FileRows::Changes);
        // (parts of 500 rows: slices held are copied together every 32)
        for (batch, buckets) in id_batches(&schema, &ids, 1_000, |id| (id % 2) as i32)? {
            data.write(&batch, &buckets).await?;
            changes.write(&batch, &buckets).await?;
        }
        let read = |add: Add| {
            let store = Arc::clone(&store);
            async move {
                let bytes = file_bytes(&store, &add).await?;
                let options =
                    ArrowReaderOptions::new().with_page_index_policy(PageIndexPolicy::Required);
                let builder =
                    ParquetRecordBatchReaderBuilder::try_new_with_options(bytes, options)?;
                let metadata = Arc::clone(builder.metadata());
                let batches = builder
                    .build()?
                    .collect::<std::result::Result<Vec<_>, _>>()?;
                Ok::<_, DataFusionError>((metadata, batches))
            }
        };
        let mut seen = Vec::new();
        for add in data.finish().await? {
            let (metadata, batches) = read(add).await?;
            let mut rows = v_id_rows(&batches).into_iter();
            for (g, group) in metadata.row_groups().iter().enumerate() {
                let group: Vec<(i64, i64)> =
                    rows.by_ref().take(group.num_rows() as usize).collect();
                assert!(
                    group.windows(2).all(|w| w[0].1 <= w[1].1),
                    "row group {g} sorted"
                );
                assert!(group.iter().all(|(v, id)| *v == id * 2), "rows moved whole");
                seen.extend(group.iter().map(|(_, id)| *id));
            }
            let offsets = metadata.offset_index().expect("offset index");
            for (g, columns) in offsets.iter().enumerate() {
                let pages = columns[1].page_locations();
                let rows = metadata.row_group(g).num_rows();
                let mut firsts: Vec<i64> = pages.iter().map(|p| p.first_row_index).collect();
                firsts.push(rows);
                assert!(firsts.windows(2).all(|w| w[1] - w[0] <= PAGE_ROWS as i64));
            }
        }
        seen.sort_unstable();
        assert_eq!(seen, (0..n).collect::<Vec<_>>());
        // change files: the order written
        let mut written = Vec::new();
        for add in changes.finish().await? {
            let (_, batches) = read(add).await?;
            written.extend(
                batches
                    .iter()
                    .flat_map(|b| b.column(1).as_primitive::<Int64Type>().values().to_vec()),
            );
        }
        let expected: Vec<i64> = ids
            .iter()
            .copied()
            .filter(|id| id % 2 == 0)
            .chain(ids.iter().copied().filter(|id| id % 2 == 1))
            .collect();
        assert_eq!(written, expected);
        Ok(())
    }

    /// Every integer, date and timestamp type is checked for order (the
    /// types the fold encodes from their values); nulls, descending values
    /// and other types are not.
    #[test]
    fn ascending_ranges_of_every_checked_type() -> Result<()> {
        use arrow::array::{ArrayRef, Float64Array, Int8Array, UInt16Array, UInt8Array};
        use arrow::array::{Date32Array, TimestampMicrosecondArray};
        let ascending: [(ArrayRef, i128); 5] = [
            (Arc::new(Int8Array::from(vec![-3, 1, 1, 4])), -3),
            (Arc::new(UInt8Array::from(vec![0, 1, 1, 4])), 0),
            (Arc::new(UInt16Array::from(vec![0, 1, 1, 4])), 0),
            (Arc::new(Date32Array::from(vec![-3, 1, 1, 4])), -3),
            (
                Arc::new(TimestampMicrosecondArray::from(vec![-3, 1, 1, 4]).with_timezone("UTC")),
                -3,
            ),
        ];
        for (column, first) in ascending {
            assert_eq!(
                ascending_range(column.as_ref()),
                Some((first, 4)),
                "{}",
                column.data_type()
            );
        }
        assert_eq!(ascending_range(&Int8Array::from(vec![2, 1])), None);
        assert_eq!(ascending_range(&Int8Array::from(vec![Some(1), None])), None);
        assert_eq!(ascending_range(&Float64Array::from(vec![1.0, 2.0])), None);
        Ok(())
    }

    /// A row group whose rows came in key order is written as they came;
    /// one with a part out of order is sorted. Every row group is sorted
    /// and every row written once.
    #[tokio::test]
    async fn row_groups_in_key_order_or_not_are_written_sorted() -> Result<()> {
        use deltalake_core::parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;
        use object_store::memory::InMemory;

        let store: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
        let schema = Arc::new(Schema::new(vec![
            Field::new("id", DataType::Int64, false),
            Field::new("v", DataType::Int64, false),
        ]));
        // 100 000 ids in order in parts of 1 000, then 30 000 scattered
        // ones (among them ids below those already written)
        let ordered: Vec<i64> = (0..100_000).map(|i| i * 2).collect();
        let scattered: Vec<i64> = (0..30_000).map(|i| (i * 7_919) % 30_000 * 2 + 1).collect();
        let mut data = BucketWriter::new(Arc::clone(&store), Arc::clone(&schema), FileRows::Hidden)
            .with_key_filters(&[0]);
        for chunk in ordered.chunks(1_000).chain(scattered.chunks(1_000)) {
            let batch = RecordBatch::try_new(
                Arc::clone(&schema),
                vec![
                    Arc::new(Int64Array::from(chunk.to_vec())),
                    Arc::new(Int64Array::from_iter_values(chunk.iter().map(|id| id * 3))),
                ],
            )?;
            data.write(&batch, &Int32Array::from(vec![0; chunk.len()]))
                .await?;
        }
        let [add] = <[Add; 1]>::try_from(data.finish().await?)
            .map_err(|adds| DataFusionError::Internal(format!("{} files", adds.len())))?;
        let bytes = file_bytes(&store, &add).await?;
        let builder = ParquetRecordBatchReaderBuilder::try_new(bytes)?;
        let groups: Vec<usize> = builder
            .metadata()
            .row_groups()
            .iter()
            .map(|g| g.num_rows() as usize)
            .collect();
        let batches = builder
            .build()?
            .collect::<std::result::Result<Vec<_>, _>>()?;
        let mut rows = batches.iter().flat_map(|b| {
            let id = b.column(0).as_primitive::<Int64Type>().values().to_vec();
            let v = b.column(1).as_primitive::<Int64Type>().values().to_vec();
            id.into_iter().zip(v)
        });
        let mut seen = Vec::new();
        for (g, &len) in groups.iter().enumerate() {
            let group: Vec<(i64, i64)> = rows.by_ref().take(len).collect();
            assert!(
                group.windows(2).all(|w| w[0].0 <= w[1].0),
                "row group {g} sorted"
            );
            assert!(group.iter().all(|(id, v)| *v == id * 3), "rows moved whole");
            seen.extend(group.iter().map(|(id, _)| *id));
        }
        // a row group of ordered rows, then one of the other ordered rows
        // and the scattered ones, sorted
        assert_eq!(groups, vec![ROW_GROUP_ROWS, 130_000 - ROW_GROUP_ROWS]);
        assert_eq!(&seen[..ROW_GROUP_ROWS], &ordered[..ROW_GROUP_ROWS]);
        seen.sort_unstable();
        let mut expected = [ordered, scattered].concat();
        expected.sort_unstable();
        assert_eq!(seen, expected);
        Ok(())
    }

    /// Rows in key order whose buckets interleave (an index-sorted fold's
    /// output): each file gets exactly its bucket's rows, whole and in key
    /// order, across row groups and copies of held slices.
    #[tokio::test]
    async fn interleaved_buckets_in_key_order_keep_their_order() -> Result<()> {
        use deltalake_core::parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;
        use object_store::memory::InMemory;

        let store: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
        let schema = v_id_schema();
        let n: i64 = 300_000;
        let mut data =
            BucketWriter::new(Arc::clone(&store), Arc::clone(&schema), FileRows::Visible)
                .with_key_filters(&[1]);
        let ids: Vec<i64> = (0..n).collect();
        for (batch, buckets) in id_batches(&schema, &ids, 700, |id| (id % 3) as i32)? {
            data.write(&batch, &buckets).await?;
        }
        let adds = data.finish().await?;
        assert_eq!(adds.len(), 3);
        for add in adds {
            let bucket: i64 = add.partition_values[BUCKET_COL]
                .as_deref()
                .and_then(|b| b.parse().ok())
                .expect("bucket");
            let bytes = file_bytes(&store, &add).await?;
            let builder = ParquetRecordBatchReaderBuilder::try_new(bytes)?;
            assert!(builder.metadata().num_row_groups() > 1);
            let batches = builder
                .build()?
                .collect::<std::result::Result<Vec<_>, _>>()?;
            let rows = v_id_rows(&batches);
            let expected: Vec<(i64, i64)> = (0..n)
                .filter(|id| id % 3 == bucket)
                .map(|id| (id * 2, id))
                .collect();
            assert_eq!(rows, expected, "bucket {bucket}");
        }
        Ok(())
    }

    /// Rows are grouped by (group, bucket), stably, and the runs of each
    /// bucket found.
    #[test]
    fn rows_are_grouped_by_bucket() -> Result<()> {
        let batch = RecordBatch::try_new(
            Arc::new(Schema::new(vec![Field::new("v", DataType::Int64, false)])),
            vec![Arc::new(Int64Array::from(vec![10, 11, 12, 13, 14, 15]))],
        )?;
        let buckets = Int32Array::from(vec![3, 0, 2, 0, 3, 1]);
        assert!(!is_grouped(buckets.values()));
        // group: bucket parity (odd buckets first), then bucket
        let (rows, grouped) = group_by_bucket(&batch, &buckets, |b| 1 - b % 2)?;
        assert_eq!(grouped.values().to_vec(), vec![1, 3, 3, 0, 0, 2]);
        assert_eq!(
            rows.column(0).as_primitive::<Int64Type>().values().to_vec(),
            vec![15, 10, 14, 11, 13, 12]
        );
        let runs: Vec<_> = bucket_runs(grouped.values()).collect();
        assert_eq!(runs, vec![(1, 0..1), (3, 1..3), (0, 3..5), (2, 5..6)]);
        let (_, grouped) = group_by_bucket(&batch, &buckets, |b| b)?;
        assert!(is_grouped(grouped.values()));
        Ok(())
    }
}
