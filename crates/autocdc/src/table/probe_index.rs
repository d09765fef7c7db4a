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
//! | cached entry for the file (path, size, modification time) | the probe |
//! |---|---|
//! | none | reads the tail (metadata, page index, filters) and caches it |
//! | with metadata, filters read | reads nothing more before the key pages |
//! | with metadata, filters not read (the last update had too many keys to check them) | reads the filters, caches them |
//!
//! The entries count against the session's metadata cache limit
//! (`datafusion.runtime.metadata_cache_limit`), least recently used first
//! out, beside DataFusion's own Parquet metadata.

use std::any::Any;
use std::sync::Arc;

use chrono::DateTime;
use datafusion::common::HashMap;
use datafusion::execution::cache::cache_manager::{
    CachedFileMetadataEntry, FileMetadata, FileMetadataCache,
};
use deltalake_core::kernel::LogicalFileView;
use deltalake_core::parquet::arrow::arrow_reader::ArrowReaderMetadata;
use object_store::ObjectMeta;

use super::deletion_vectors::KeyFilters;

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
        let file = ObjectMeta {
            location: view.object_store_path(),
            last_modified: DateTime::from_timestamp_millis(view.modification_time())
                .unwrap_or_default(),
            size: view.size().max(0) as u64,
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
