//! What a probe for keys needs of a data file before reading any row — its
//! Parquet metadata with the page index, and its key bloom filters — kept in
//! the session's file metadata cache between updates.
//!
//! Data files never change once written (a deletion vector is beside the
//! file, not in it), so what one update read of a file holds for every
//! later update while the file lives. A long-running process (a continuous
//! pipeline, a server taking DML) then probes a file for keys without a
//! request when its filters rule the keys out, and with one request for the
//! pages of the keys otherwise:
//!
//! A writer caches the entry of each data file it writes from the tail it
//! wrote ([`written_index`]): even a file's first probe reads nothing before
//! its key pages.
//!
//! | cached entry for the file (path, size, modification time) | the probe |
//! |---|---|
//! | none (another process wrote it, or it was evicted) | reads the tail (metadata, page index, filters) and caches it |
//! | with metadata, filters read | reads nothing more before the key pages |
//! | with metadata, filters not read (the last update had too many keys to check them) | reads the filters, caches them |
//!
//! The entries count against the session's metadata cache limit
//! (`datafusion.runtime.metadata_cache_limit`), least recently used first
//! out, beside DataFusion's own Parquet metadata.

use std::any::Any;
use std::ops::Range;
use std::sync::Arc;

use bytes::Bytes;
use chrono::DateTime;
use datafusion::common::HashMap;
use datafusion::execution::cache::cache_manager::{
    CachedFileMetadataEntry, FileMetadata, FileMetadataCache,
};
use deltalake_core::kernel::LogicalFileView;
use deltalake_core::parquet::arrow::arrow_reader::ArrowReaderMetadata;
use object_store::ObjectMeta;

use deltalake_core::parquet::arrow::arrow_reader::ArrowReaderOptions;
use deltalake_core::parquet::bloom_filter::Sbbf;
use deltalake_core::parquet::errors::Result as ParquetResult;
use deltalake_core::parquet::file::metadata::{
    PageIndexPolicy, ParquetMetaData, ParquetMetaDataReader,
};
use object_store::path::Path;

use super::file_tail::Tail;

/// The bloom filters of a file's key columns that a probe checks.
pub(crate) struct KeyFilters {
    /// The key columns, in the order of `filters`' inner vectors.
    pub(crate) names: Vec<String>,
    /// By row group and key column (`None`: no filter to check).
    pub(crate) filters: Vec<Vec<Option<Sbbf>>>,
}

impl KeyFilters {
    /// The filters at `ranges` ([`filter_ranges`]) of the file `metadata`
    /// describes, whose bytes are `bytes` (in the same order), for its key
    /// columns `names`.
    pub(crate) fn read(
        names: Vec<String>,
        metadata: &ParquetMetaData,
        ranges: &[FilterRange],
        bytes: Vec<Bytes>,
    ) -> ParquetResult<Self> {
        let mut filters: Vec<Vec<Option<Sbbf>>> = (0..metadata.num_row_groups())
            .map(|_| names.iter().map(|_| None).collect())
            .collect();
        for ((group, c, _), bytes) in ranges.iter().zip(bytes) {
            if let Some(slot) = filters.get_mut(*group).and_then(|g| g.get_mut(*c)) {
                *slot = Some(Sbbf::from_bytes(&bytes)?);
            }
        }
        Ok(Self { names, filters })
    }
}

/// The leaves of the columns `names` in the file `metadata` describes, if
/// it has them all.
pub(crate) fn leaves_of(metadata: &ParquetMetaData, names: &[String]) -> Option<Vec<usize>> {
    let schema = metadata.file_metadata().schema_descr();
    names
        .iter()
        .map(|n| (0..schema.num_columns()).find(|&i| schema.column(i).path().string() == *n))
        .collect()
}

/// A data file's Parquet metadata and key filters, as cached.
#[derive(Clone)]
pub(crate) struct ProbeIndex {
    pub(crate) metadata: ArrowReaderMetadata,
    /// `None`: not read yet.
    pub(crate) filters: Option<Arc<KeyFilters>>,
}

impl FileMetadata for ProbeIndex {
    fn as_any(&self) -> &dyn Any {
        self
    }

    fn memory_size(&self) -> usize {
        let filters: usize = self
            .filters
            .iter()
            .flat_map(|f| f.filters.iter().flatten().flatten())
            .map(|filter| filter.num_blocks() * 32)
            .sum();
        self.metadata.metadata().memory_size() + filters
    }

    fn extra_info(&self) -> HashMap<String, String> {
        HashMap::from([(
            "autocdc_key_filters".to_string(),
            self.filters.is_some().to_string(),
        )])
    }
}

/// A data file's entry in a session's file metadata cache.
pub(crate) struct CachedIndex<'a> {
    cache: &'a FileMetadataCache,
    file: ObjectMeta,
}

impl<'a> CachedIndex<'a> {
    /// The entry of the data file `view` in `cache`.
    pub(crate) fn new(cache: &'a FileMetadataCache, view: &LogicalFileView) -> Self {
        Self::of_file(
            cache,
            view.object_store_path(),
            view.size().max(0) as u64,
            view.modification_time(),
        )
    }

    /// The entry of the data file at `location` of `size` bytes, modified
    /// at `modified` (milliseconds since the epoch, as in its `add`).
    pub(crate) fn of_file(
        cache: &'a FileMetadataCache,
        location: Path,
        size: u64,
        modified: i64,
    ) -> Self {
        let file = ObjectMeta {
            location,
            last_modified: DateTime::from_timestamp_millis(modified).unwrap_or_default(),
            size,
            e_tag: None,
            version: None,
        };
        Self { cache, file }
    }

    /// The file's index, if cached for this very file.
    pub(crate) fn get(&self) -> Option<ProbeIndex> {
        let entry = self.cache.get(&self.file.location)?;
        if !entry.is_valid_for(&self.file) {
            return None;
        }
        entry
            .file_metadata
            .as_any()
            .downcast_ref::<ProbeIndex>()
            .cloned()
    }

    /// Cache `index` as the file's.
    pub(crate) fn put(&self, index: ProbeIndex) {
        self.cache.put(
            &self.file.location,
            CachedFileMetadataEntry::new(self.file.clone(), Arc::new(index)),
        );
    }
}

/// The index of a data file just written, from the `tail` its writer kept:
/// its metadata and page index, and the filters of its key columns `keys`
/// (the table's, in table order); `None` when the tail does not hold them
/// all (no request is made).
pub(crate) fn written_index(tail: &Tail, keys: &[String]) -> Option<ProbeIndex> {
    let mut reader = ParquetMetaDataReader::new().with_page_index_policy(PageIndexPolicy::Optional);
    reader
        .try_parse_sized(tail.bytes(), tail.file_size())
        .ok()?;
    let metadata = Arc::new(reader.finish().ok()?);
    let options = ArrowReaderOptions::new().with_page_index_policy(PageIndexPolicy::Optional);
    let metadata = ArrowReaderMetadata::try_new(metadata, options).ok()?;
    let leaves = leaves_of(metadata.metadata(), keys)?;
    let ranges = filter_ranges(metadata.metadata(), &leaves, &vec![true; leaves.len()])?;
    let bytes: Vec<Bytes> = ranges
        .iter()
        .map(|(_, _, range)| tail.slice(range))
        .collect::<Option<_>>()?;
    let filters = KeyFilters::read(keys.to_vec(), metadata.metadata(), &ranges, bytes).ok()?;
    Some(ProbeIndex {
        metadata,
        filters: Some(Arc::new(filters)),
    })
}

/// Where a key filter of a file is: (row group, key column, its bytes).
pub(crate) type FilterRange = (usize, usize, Range<u64>);

/// Where the filters of the key columns `leaves` that `wanted` marks are in
/// the file `metadata` describes, in every row group that records their
/// length (another writer's filter of unknown length is not checked);
/// `None` when one's offset or length is negative.
pub(crate) fn filter_ranges(
    metadata: &ParquetMetaData,
    leaves: &[usize],
    wanted: &[bool],
) -> Option<Vec<FilterRange>> {
    let mut ranges = Vec::new();
    for (group, row_group) in metadata.row_groups().iter().enumerate() {
        for (c, (&leaf, &wanted)) in leaves.iter().zip(wanted).enumerate() {
            let chunk = row_group.column(leaf);
            if let (true, Some(offset), Some(length)) = (
                wanted,
                chunk.bloom_filter_offset(),
                chunk.bloom_filter_length(),
            ) {
                let start = u64::try_from(offset).ok()?;
                let length = u64::try_from(length).ok()?;
                ranges.push((group, c, start..start.checked_add(length)?));
            }
        }
    }
    Some(ranges)
}
