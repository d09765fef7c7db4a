//! Unit tests' in-memory store that counts its reads and listings (the integration
//! tests have their own, `tests/common/observed_store.rs`).

use std::sync::atomic::{AtomicUsize, Ordering};

use futures::stream::BoxStream;
use object_store::memory::InMemory;
use object_store::path::Path;
use object_store::{
    CopyOptions, GetOptions, GetResult, ListResult, MultipartUpload, ObjectMeta, ObjectStore,
    PutMultipartOptions, PutOptions, PutPayload, PutResult,
};

/// An [`InMemory`] store counting the reads made of it.
#[derive(Debug, Default)]
pub(crate) struct Counted {
    inner: InMemory,
    gets: AtomicUsize,
    range_calls: AtomicUsize,
    lists: AtomicUsize,
}

impl Counted {
    /// Reads made so far.
    pub(crate) fn gets(&self) -> usize {
        self.gets.load(Ordering::SeqCst)
    }

    /// Calls of `get_ranges` made so far (each read as the trait's default
    /// does, coalesced ranges through `get_opts`, counted as reads too).
    pub(crate) fn range_calls(&self) -> usize {
        self.range_calls.load(Ordering::SeqCst)
    }

    /// Listings made so far; the count starts again.
    pub(crate) fn take_lists(&self) -> usize {
        self.lists.swap(0, Ordering::SeqCst)
    }

    /// Reads made so far; the count starts again.
    pub(crate) fn take_gets(&self) -> usize {
        self.gets.swap(0, Ordering::SeqCst)
    }
}

impl std::fmt::Display for Counted {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Counted")
    }
}

#[async_trait::async_trait]
impl ObjectStore for Counted {
    async fn put_opts(
        &self,
        location: &Path,
        payload: PutPayload,
        opts: PutOptions,
    ) -> object_store::Result<PutResult> {
        self.inner.put_opts(location, payload, opts).await
    }
    async fn put_multipart_opts(
        &self,
        location: &Path,
        opts: PutMultipartOptions,
    ) -> object_store::Result<Box<dyn MultipartUpload>> {
        self.inner.put_multipart_opts(location, opts).await
    }
    async fn get_opts(
        &self,
        location: &Path,
        options: GetOptions,
    ) -> object_store::Result<GetResult> {
        self.gets.fetch_add(1, Ordering::SeqCst);
        self.inner.get_opts(location, options).await
    }
    async fn get_ranges(
        &self,
        location: &Path,
        ranges: &[std::ops::Range<u64>],
    ) -> object_store::Result<Vec<bytes::Bytes>> {
        self.range_calls.fetch_add(1, Ordering::SeqCst);
        object_store::coalesce_ranges(
            ranges,
            |range| object_store::ObjectStoreExt::get_range(self, location, range),
            object_store::OBJECT_STORE_COALESCE_DEFAULT,
        )
        .await
    }
    fn delete_stream(
        &self,
        locations: BoxStream<'static, object_store::Result<Path>>,
    ) -> BoxStream<'static, object_store::Result<Path>> {
        self.inner.delete_stream(locations)
    }
    fn list(&self, prefix: Option<&Path>) -> BoxStream<'static, object_store::Result<ObjectMeta>> {
        self.lists.fetch_add(1, Ordering::SeqCst);
        self.inner.list(prefix)
    }
    fn list_with_offset(
        &self,
        prefix: Option<&Path>,
        offset: &Path,
    ) -> BoxStream<'static, object_store::Result<ObjectMeta>> {
        self.lists.fetch_add(1, Ordering::SeqCst);
        self.inner.list_with_offset(prefix, offset)
    }
    async fn list_with_delimiter(&self, prefix: Option<&Path>) -> object_store::Result<ListResult> {
        self.inner.list_with_delimiter(prefix).await
    }
    async fn copy_opts(
        &self,
        from: &Path,
        to: &Path,
        options: CopyOptions,
    ) -> object_store::Result<()> {
        self.inner.copy_opts(from, to, options).await
    }
}
