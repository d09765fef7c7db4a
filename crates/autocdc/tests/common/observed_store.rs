//! An object store over another that tells an [`Observer`] of every request
//! before making it: tests and benchmarks count requests, record what they
//! read, or fail them (fault injection) through it.
//!
//! `get_ranges` is left to the trait's default, so each coalesced range is
//! one `get`, as on a remote store.

use std::fmt;
use std::sync::Arc;

use async_trait::async_trait;
use futures::stream::{BoxStream, StreamExt};
use object_store::path::Path;
use object_store::{
    CopyOptions, GetOptions, GetResult, ListResult, MultipartUpload, ObjectMeta, ObjectStore,
    PutMultipartOptions, PutOptions, PutPayload, PutResult, RenameOptions,
};

/// A request about to be made.
#[derive(Debug, Clone, Copy)]
pub enum Request<'a> {
    /// A read of `location`: a range of it (`ranged`), all of it, or its
    /// metadata only (`head`).
    Get {
        location: &'a Path,
        ranged: bool,
        head: bool,
    },
    /// A listing.
    List { prefix: Option<&'a Path> },
    /// A write of `location`.
    Put { location: &'a Path },
    /// A copy, a rename or a delete.
    Other,
}

/// Told of every request of an [`ObservedStore`].
pub trait Observer: Send + Sync + fmt::Debug + 'static {
    /// Called before `request` is made; an error fails it instead.
    fn request(&self, request: Request<'_>) -> object_store::Result<()>;
}

/// The store (see the module docs).
#[derive(Debug)]
pub struct ObservedStore<O> {
    inner: Arc<dyn ObjectStore>,
    observer: O,
}

impl<O: Observer> ObservedStore<O> {
    /// `inner`, its requests told to `observer`.
    pub fn new(inner: Arc<dyn ObjectStore>, observer: O) -> Self {
        Self { inner, observer }
    }

    /// The observer.
    pub fn observer(&self) -> &O {
        &self.observer
    }

    /// `ok`, or one error if the observer fails `request`.
    fn stream<T: Send + 'static>(
        &self,
        request: Request<'_>,
        ok: impl FnOnce() -> BoxStream<'static, object_store::Result<T>>,
    ) -> BoxStream<'static, object_store::Result<T>> {
        match self.observer.request(request) {
            Ok(()) => ok(),
            Err(e) => futures::stream::once(async move { Err(e) }).boxed(),
        }
    }
}

impl<O> fmt::Display for ObservedStore<O> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "ObservedStore({})", self.inner)
    }
}

#[async_trait]
impl<O: Observer> ObjectStore for ObservedStore<O> {
    async fn put_opts(
        &self,
        location: &Path,
        payload: PutPayload,
        opts: PutOptions,
    ) -> object_store::Result<PutResult> {
        self.observer.request(Request::Put { location })?;
        self.inner.put_opts(location, payload, opts).await
    }
    async fn put_multipart_opts(
        &self,
        location: &Path,
        opts: PutMultipartOptions,
    ) -> object_store::Result<Box<dyn MultipartUpload>> {
        self.observer.request(Request::Put { location })?;
        self.inner.put_multipart_opts(location, opts).await
    }
    async fn get_opts(
        &self,
        location: &Path,
        options: GetOptions,
    ) -> object_store::Result<GetResult> {
        let ranged = options.range.is_some();
        let head = options.head;
        self.observer.request(Request::Get {
            location,
            ranged,
            head,
        })?;
        self.inner.get_opts(location, options).await
    }
    fn delete_stream(
        &self,
        locations: BoxStream<'static, object_store::Result<Path>>,
    ) -> BoxStream<'static, object_store::Result<Path>> {
        self.stream(Request::Other, || self.inner.delete_stream(locations))
    }
    fn list(&self, prefix: Option<&Path>) -> BoxStream<'static, object_store::Result<ObjectMeta>> {
        self.stream(Request::List { prefix }, || self.inner.list(prefix))
    }
    fn list_with_offset(
        &self,
        prefix: Option<&Path>,
        offset: &Path,
    ) -> BoxStream<'static, object_store::Result<ObjectMeta>> {
        self.stream(Request::List { prefix }, || {
            self.inner.list_with_offset(prefix, offset)
        })
    }
    async fn list_with_delimiter(&self, prefix: Option<&Path>) -> object_store::Result<ListResult> {
        self.observer.request(Request::List { prefix })?;
        self.inner.list_with_delimiter(prefix).await
    }
    async fn copy_opts(
        &self,
        from: &Path,
        to: &Path,
        options: CopyOptions,
    ) -> object_store::Result<()> {
        self.observer.request(Request::Other)?;
        self.inner.copy_opts(from, to, options).await
    }
    async fn rename_opts(
        &self,
        from: &Path,
        to: &Path,
        options: RenameOptions,
    ) -> object_store::Result<()> {
        self.observer.request(Request::Other)?;
        self.inner.rename_opts(from, to, options).await
    }
}
