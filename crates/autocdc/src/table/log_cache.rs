//! The warehouse's store keeps the Delta commit files and deletion vectors
//! this process wrote or read, and serves later reads of them from memory.
//!
//! Why: bringing a table up to date, deltalake reads each new commit file
//! twice (once for the protocol and metadata, once for the files), and
//! publishing a state version reads it a third time; every statement reads
//! the deletion vectors the previous one wrote. On an object store each of
//! those reads is a round trip, and all of them come one after another.
//!
//! Both kinds of file are written once: a commit file only if absent (put
//! if absent is how Delta commits), a deletion vector under a fresh UUID.
//! A path can still be written again after its file was deleted (a table
//! dropped and created again, by another process perhaps), so a kept commit
//! file is served only while listings of its log agree with it: deltalake
//! lists a log before it reads the commits the listing names.
//!
//! | request | file | what the cache does |
//! |---|---|---|
//! | put, succeeded | commit file, with an e-tag | keeps it, unconfirmed |
//! | put, succeeded | deletion vector | keeps it, confirmed |
//! | whole read of the latest version, passed on | commit file, with an e-tag | keeps it, confirmed |
//! | listing names it | kept commit file | same size and e-tag: confirmed, with the listed metadata; else dropped |
//! | read (whole or a range), no conditions | kept and confirmed | served from memory |
//! | any other read | — | passed on |
//! | put, copy, rename or delete of its path | kept file | dropped first |
//!
//! Listings of a log pass through too, but the store remembers the last
//! one of each log, so that the listing deltalake makes right after its own
//! commit is answered from it plus the commit put ([`super::log_listing`]).
//!
//! The kept bytes are bounded ([`KEPT_BYTES`]); the oldest kept file goes
//! first, and a file larger than a quarter of the bound is not kept. Other
//! files (data files, checkpoints, `_last_checkpoint`) pass through; the
//! ranges a Parquet reader asks of a data file at once go to the store's own
//! `get_ranges`, those less than [`RANGE_GAP`] apart read as one.

use std::collections::{HashMap, VecDeque};
use std::fmt;
use std::ops::Range;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use async_trait::async_trait;
use bytes::Bytes;
use futures::stream::{BoxStream, StreamExt, TryStreamExt};
use object_store::path::Path;
use object_store::{
    CopyOptions, GetOptions, GetResult, GetResultPayload, ListResult, MultipartUpload, ObjectMeta,
    ObjectStore, PutMode, PutMultipartOptions, PutOptions, PutPayload, PutResult, RenameOptions,
};

use super::log_listing::{commit_version, Listings};

/// Bytes of files kept at most.
pub(crate) const KEPT_BYTES: usize = 16 << 20;

/// A store over another that keeps commit files and deletion vectors (see
/// the module docs).
#[derive(Debug)]
pub(crate) struct LogCachingStore {
    inner: Arc<dyn ObjectStore>,
    kept: Arc<Mutex<Kept>>,
    listings: Arc<Mutex<Listings>>,
}

impl LogCachingStore {
    /// `inner`, with an empty cache.
    pub(crate) fn new(inner: Arc<dyn ObjectStore>) -> Self {
        Self {
            inner,
            kept: Arc::new(Mutex::new(Kept::new(KEPT_BYTES))),
            listings: Arc::default(),
        }
    }

    /// Runs `f` on the kept files. A poisoned lock (a panic elsewhere while
    /// holding it) leaves the cache out of the way: `None`.
    fn with_kept<T>(&self, f: impl FnOnce(&mut Kept) -> T) -> Option<T> {
        with_kept(&self.kept, f)
    }
}

fn with_kept<T>(kept: &Mutex<Kept>, f: impl FnOnce(&mut Kept) -> T) -> Option<T> {
    kept.lock().ok().map(|mut kept| f(&mut kept))
}

/// Runs `f` on what is known of the logs' listings; a poisoned lock leaves
/// them out of the way (`None`: every listing goes to the store).
fn with_listings<T>(listings: &Mutex<Listings>, f: impl FnOnce(&mut Listings) -> T) -> Option<T> {
    listings.lock().ok().map(|mut listings| f(&mut listings))
}

/// The kinds of file kept.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    /// `…/_delta_log/<20 digits>.json`.
    Commit,
    /// `…/deletion_vector_<uuid>.bin`.
    DeletionVector,
}

impl Kind {
    fn of(path: &Path) -> Option<Self> {
        let mut parts = path.as_ref().rsplit(object_store::path::DELIMITER);
        let name = parts.next()?;
        if let Some(version) = name.strip_suffix(".json") {
            let in_log = parts.next() == Some("_delta_log");
            let numbered = version.len() == 20 && version.bytes().all(|b| b.is_ascii_digit());
            return (in_log && numbered).then_some(Self::Commit);
        }
        (name.starts_with("deletion_vector_") && name.ends_with(".bin"))
            .then_some(Self::DeletionVector)
    }
}

/// A kept file.
#[derive(Debug)]
struct File {
    bytes: Bytes,
    /// Its metadata as the store reported it; `last_modified` of a commit
    /// file comes from a listing or a read.
    meta: ObjectMeta,
    /// Whether reads may be served (see the module docs).
    confirmed: bool,
}

/// The kept files, oldest first in `order`.
#[derive(Debug)]
struct Kept {
    files: HashMap<Path, File>,
    order: VecDeque<Path>,
    bytes: usize,
    limit: usize,
}

impl Kept {
    fn new(limit: usize) -> Self {
        Self {
            files: HashMap::new(),
            order: VecDeque::new(),
            bytes: 0,
            limit,
        }
    }

    fn keep(&mut self, bytes: Bytes, meta: ObjectMeta, confirmed: bool) {
        self.drop_file(&meta.location);
        if bytes.len() > self.limit / 4 || bytes.len() as u64 != meta.size {
            return;
        }
        while self.bytes + bytes.len() > self.limit {
            let Some(oldest) = self.order.pop_front() else {
                break;
            };
            if let Some(file) = self.files.remove(&oldest) {
                self.bytes -= file.bytes.len();
            }
        }
        self.bytes += bytes.len();
        self.order.push_back(meta.location.clone());
        let file = File {
            bytes,
            meta,
            confirmed,
        };
        self.files.insert(file.meta.location.clone(), file);
    }

    fn drop_file(&mut self, path: &Path) {
        if let Some(file) = self.files.remove(path) {
            self.bytes -= file.bytes.len();
            self.order.retain(|p| p != path);
        }
    }

    /// A listing named `meta`.
    fn listed(&mut self, meta: &ObjectMeta) {
        let Some(file) = self.files.get_mut(&meta.location) else {
            return;
        };
        let same =
            meta.e_tag.is_some() && meta.e_tag == file.meta.e_tag && meta.size == file.meta.size;
        if same {
            file.meta = meta.clone();
            file.confirmed = true;
        } else {
            self.drop_file(&meta.location);
        }
    }

    /// The kept file at `path`, if confirmed, as a read with `options`
    /// would return it; `None`: the read goes to the store.
    fn serve(&self, path: &Path, options: &GetOptions) -> Option<GetResult> {
        let unconditional = options.if_match.is_none()
            && options.if_none_match.is_none()
            && options.if_modified_since.is_none()
            && options.if_unmodified_since.is_none()
            && options.version.is_none()
            && !options.head;
        let file = self
            .files
            .get(path)
            .filter(|f| f.confirmed && unconditional)?;
        let range = match &options.range {
            Some(range) => range.as_range(file.meta.size).ok()?,
            None => 0..file.meta.size,
        };
        let bytes = file
            .bytes
            .slice(usize::try_from(range.start).ok()?..usize::try_from(range.end).ok()?);
        Some(GetResult {
            payload: GetResultPayload::Stream(
                futures::stream::once(async move { Ok(bytes) }).boxed(),
            ),
            meta: file.meta.clone(),
            range,
            attributes: Default::default(),
        })
    }
}

impl fmt::Display for LogCachingStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "LogCaching({})", self.inner)
    }
}

#[async_trait]
impl ObjectStore for LogCachingStore {
    async fn put_opts(
        &self,
        location: &Path,
        payload: PutPayload,
        opts: PutOptions,
    ) -> object_store::Result<PutResult> {
        self.with_kept(|kept| kept.drop_file(location));
        let kind = Kind::of(location);
        let commit = kind == Some(Kind::Commit);
        with_listings(&self.listings, |l| l.putting(location, commit));
        let Some(kind) = kind else {
            return self.inner.put_opts(location, payload, opts).await;
        };
        let if_absent = matches!(opts.mode, PutMode::Create);
        let bytes = Bytes::from(payload.clone());
        let result = match self.inner.put_opts(location, payload, opts).await {
            Ok(result) => result,
            Err(e) => {
                with_listings(&self.listings, |l| l.changed(location));
                return Err(e);
            }
        };
        let meta = (result.e_tag.is_some() || kind == Kind::DeletionVector).then(|| ObjectMeta {
            location: location.clone(),
            // (a commit file's is taken from the listing that confirms it)
            last_modified: chrono::Utc::now(),
            size: bytes.len() as u64,
            e_tag: result.e_tag.clone(),
            version: result.version.clone(),
        });
        if commit {
            with_listings(&self.listings, |l| {
                match (commit_version(location), &meta) {
                    (Some(version), Some(meta)) if if_absent => {
                        l.committed(meta, version, Instant::now())
                    }
                    _ => l.changed(location),
                }
            });
        }
        if let Some(meta) = meta {
            self.with_kept(|kept| kept.keep(bytes, meta, kind == Kind::DeletionVector));
        }
        Ok(result)
    }

    async fn put_multipart_opts(
        &self,
        location: &Path,
        opts: PutMultipartOptions,
    ) -> object_store::Result<Box<dyn MultipartUpload>> {
        self.with_kept(|kept| kept.drop_file(location));
        with_listings(&self.listings, |l| l.changed(location));
        self.inner.put_multipart_opts(location, opts).await
    }

    async fn get_opts(
        &self,
        location: &Path,
        options: GetOptions,
    ) -> object_store::Result<GetResult> {
        // (data files, the bulk of reads, go straight to the store)
        let Some(kind) = Kind::of(location) else {
            return self.inner.get_opts(location, options).await;
        };
        if let Some(served) = self
            .with_kept(|kept| kept.serve(location, &options))
            .flatten()
        {
            return Ok(served);
        }
        let whole = options.range.is_none() && !options.head && options.version.is_none();
        let result = self.inner.get_opts(location, options).await?;
        let keepable = whole
            && kind == Kind::Commit
            && result.meta.e_tag.is_some()
            && result.meta.size <= (KEPT_BYTES / 4) as u64;
        if !keepable {
            return Ok(result);
        }
        let meta = result.meta.clone();
        let range = result.range.clone();
        let attributes = result.attributes.clone();
        let bytes = result.bytes().await?;
        self.with_kept(|kept| kept.keep(bytes.clone(), meta.clone(), true));
        Ok(GetResult {
            payload: GetResultPayload::Stream(
                futures::stream::once(async move { Ok(bytes) }).boxed(),
            ),
            meta,
            range,
            attributes,
        })
    }

    /// Ranges of a data file go to the store's own `get_ranges`, those less
    /// than [`RANGE_GAP`] apart merged (the trait's default would coalesce
    /// them through [`Self::get_opts`] into reads of whole megabytes, where
    /// a local file system reads each range alone from one open file: a
    /// probe for a few keys read most of every row group it touched, while
    /// an update touching every page reads them best as whole column
    /// chunks); the ranges of a kept file are served one by one.
    async fn get_ranges(
        &self,
        location: &Path,
        ranges: &[Range<u64>],
    ) -> object_store::Result<Vec<Bytes>> {
        if Kind::of(location).is_none() {
            let merged = merge_ranges(ranges, RANGE_GAP);
            let read = self.inner.get_ranges(location, &merged.reads).await?;
            return merged.slices(ranges, &read);
        }
        futures::future::try_join_all(
            ranges
                .iter()
                .map(|r| object_store::ObjectStoreExt::get_range(self, location, r.clone())),
        )
        .await
    }

    fn delete_stream(
        &self,
        locations: BoxStream<'static, object_store::Result<Path>>,
    ) -> BoxStream<'static, object_store::Result<Path>> {
        let kept = Arc::clone(&self.kept);
        let listings = Arc::clone(&self.listings);
        let locations = locations
            .inspect(move |location| {
                if let Ok(location) = location {
                    with_kept(&kept, |kept| kept.drop_file(location));
                    with_listings(&listings, |l| l.changed(location));
                }
            })
            .boxed();
        self.inner.delete_stream(locations)
    }

    fn list(&self, prefix: Option<&Path>) -> BoxStream<'static, object_store::Result<ObjectMeta>> {
        if let Some(answer) = self.answered(prefix, None) {
            return answer;
        }
        self.reconciled(prefix, None, self.inner.list(prefix))
    }

    fn list_with_offset(
        &self,
        prefix: Option<&Path>,
        offset: &Path,
    ) -> BoxStream<'static, object_store::Result<ObjectMeta>> {
        if let Some(answer) = self.answered(prefix, Some(offset)) {
            return answer;
        }
        let from = prefix.and_then(|prefix| {
            with_listings(&self.listings, |l| l.list_from(prefix, offset)).flatten()
        });
        let Some(from) = from else {
            return self.reconciled(
                prefix,
                Some(offset),
                self.inner.list_with_offset(prefix, offset),
            );
        };
        // listed from the known listing's offset, answered past `offset`
        let listing = match &from {
            Some(from) => self.inner.list_with_offset(prefix, from),
            None => self.inner.list(prefix),
        };
        let offset = offset.clone();
        self.reconciled(prefix, from.as_ref(), listing)
            .try_filter(move |meta| futures::future::ready(meta.location > offset))
            .boxed()
    }

    async fn list_with_delimiter(&self, prefix: Option<&Path>) -> object_store::Result<ListResult> {
        let listing = self.inner.list_with_delimiter(prefix).await?;
        self.with_kept(|kept| listing.objects.iter().for_each(|meta| kept.listed(meta)));
        Ok(listing)
    }

    async fn copy_opts(
        &self,
        from: &Path,
        to: &Path,
        options: CopyOptions,
    ) -> object_store::Result<()> {
        self.with_kept(|kept| kept.drop_file(to));
        with_listings(&self.listings, |l| l.changed(to));
        self.inner.copy_opts(from, to, options).await
    }

    async fn rename_opts(
        &self,
        from: &Path,
        to: &Path,
        options: RenameOptions,
    ) -> object_store::Result<()> {
        self.with_kept(|kept| {
            kept.drop_file(from);
            kept.drop_file(to);
        });
        with_listings(&self.listings, |l| {
            l.changed(from);
            l.changed(to);
        });
        self.inner.rename_opts(from, to, options).await
    }
}

impl LogCachingStore {
    /// `listing`, telling the cache of every object it names; a listing of
    /// a log read to its end is remembered ([`Listings::listed`]).
    fn reconciled(
        &self,
        prefix: Option<&Path>,
        offset: Option<&Path>,
        listing: BoxStream<'static, object_store::Result<ObjectMeta>>,
    ) -> BoxStream<'static, object_store::Result<ObjectMeta>> {
        let kept = Arc::clone(&self.kept);
        let Some(log) = prefix.filter(|p| Listings::is_log(p)).cloned() else {
            return listing
                .inspect(move |meta| {
                    if let Ok(meta) = meta {
                        with_kept(&kept, |kept| kept.listed(meta));
                    }
                })
                .boxed();
        };
        // what it named so far; `None` after an error
        let named = Arc::new(Mutex::new(Some(Vec::<ObjectMeta>::new())));
        let seen = Arc::clone(&named);
        let listings = Arc::clone(&self.listings);
        let offset = offset.cloned();
        let end = futures::stream::once(async move {
            let named = named.lock().ok().and_then(|mut named| named.take());
            if let Some(named) = named {
                with_listings(&listings, |l| {
                    l.listed(&log, offset.as_ref(), named, Instant::now())
                });
            }
            None
        })
        .filter_map(futures::future::ready);
        listing
            .inspect(move |meta| {
                let Ok(mut seen) = seen.lock() else {
                    return;
                };
                match meta {
                    Ok(meta) => {
                        with_kept(&kept, |kept| kept.listed(meta));
                        if let Some(named) = seen.as_mut() {
                            named.push(meta.clone());
                        }
                    }
                    Err(_) => *seen = None,
                }
            })
            .chain(end)
            .boxed()
    }

    /// The listing of `prefix` from `offset` answered from what is known
    /// ([`Listings::answer`]), if it is; the kept files it names are
    /// confirmed as a listing from the store would.
    fn answered(
        &self,
        prefix: Option<&Path>,
        offset: Option<&Path>,
    ) -> Option<BoxStream<'static, object_store::Result<ObjectMeta>>> {
        let prefix = prefix?;
        let named = with_listings(&self.listings, |l| l.answer(prefix, offset, Instant::now()))
            .flatten()?;
        self.with_kept(|kept| named.iter().for_each(|meta| kept.listed(meta)));
        Some(futures::stream::iter(named.into_iter().map(Ok)).boxed())
    }
}

/// Ranges of a data file closer than this are read as one.
const RANGE_GAP: u64 = 32 * 1024;

/// Ranges to read for wanted ones: those less than a gap apart merged.
struct MergedRanges {
    /// What to read, in file order.
    reads: Vec<Range<u64>>,
    /// For each wanted range, the read holding it.
    read_of: Vec<usize>,
}

/// `wanted` (in any order, overlapping or not) as [`MergedRanges`].
fn merge_ranges(wanted: &[Range<u64>], gap: u64) -> MergedRanges {
    let mut order: Vec<usize> = (0..wanted.len()).collect();
    order.sort_unstable_by_key(|&i| wanted[i].start);
    let mut reads: Vec<Range<u64>> = Vec::new();
    let mut read_of = vec![0; wanted.len()];
    for i in order {
        let range = &wanted[i];
        match reads.last_mut() {
            Some(last) if range.start <= last.end.saturating_add(gap) => {
                last.end = last.end.max(range.end);
            }
            _ => reads.push(range.clone()),
        }
        read_of[i] = reads.len() - 1;
    }
    MergedRanges { reads, read_of }
}

impl MergedRanges {
    /// The wanted ranges' bytes, sliced from `read` (the bytes of `reads`).
    fn slices(&self, wanted: &[Range<u64>], read: &[Bytes]) -> object_store::Result<Vec<Bytes>> {
        wanted
            .iter()
            .zip(&self.read_of)
            .map(|(range, &r)| {
                // (offsets in the read; none for a range ending before it starts)
                let offset = |at: u64| {
                    at.checked_sub(self.reads[r].start)
                        .and_then(|o| usize::try_from(o).ok())
                };
                match (read.get(r), offset(range.start), offset(range.end)) {
                    (Some(bytes), Some(start), Some(end)) if start <= end && end <= bytes.len() => {
                        Ok(bytes.slice(start..end))
                    }
                    _ => Err(object_store::Error::Generic {
                        store: "LogCaching",
                        source: format!(
                            "the store did not return the bytes of {:?}, which hold {range:?}",
                            self.reads[r]
                        )
                        .into(),
                    }),
                }
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::super::counted_store::Counted;
    use super::*;
    use futures::TryStreamExt;
    use object_store::{GetRange, ObjectStoreExt};

    const COMMIT: &str = "t/_delta_log/00000000000000000003.json";
    const VECTOR: &str = "t/deletion_vector_0f8e1c1e-3b7a-4a4e-9d55-9a0a8c2b8b11.bin";

    fn cached() -> (Arc<Counted>, LogCachingStore) {
        let counted = Arc::new(Counted::default());
        let store = LogCachingStore::new(Arc::clone(&counted) as _);
        (counted, store)
    }

    async fn read(store: &dyn ObjectStore, path: &str) -> Bytes {
        store
            .get(&Path::from(path))
            .await
            .expect("get")
            .bytes()
            .await
            .expect("bytes")
    }

    async fn list(store: &dyn ObjectStore, prefix: &str) {
        let _: Vec<ObjectMeta> = store
            .list(Some(&Path::from(prefix)))
            .try_collect()
            .await
            .expect("list");
    }

    #[test]
    fn only_commit_files_and_deletion_vectors_are_kept() {
        let kind = |p: &str| Kind::of(&Path::from(p));
        assert_eq!(kind(COMMIT), Some(Kind::Commit));
        assert_eq!(kind(VECTOR), Some(Kind::DeletionVector));
        for other in [
            "t/_delta_log/_last_checkpoint",
            "t/_delta_log/00000000000000000100.checkpoint.parquet",
            "t/_delta_log/0003.json",
            "t/00000000000000000003.json",
            "t/part-0001.zstd.parquet",
        ] {
            assert_eq!(kind(other), None, "{other}");
        }
    }

    #[tokio::test]
    async fn a_commit_file_written_is_read_again_from_memory_once_a_listing_confirms_it() {
        let (counted, store) = cached();
        store
            .put(
                &Path::from(COMMIT),
                PutPayload::from_static(b"{\"commitInfo\":{}}"),
            )
            .await
            .expect("put");
        // not listed yet: the read goes to the store
        assert_eq!(read(&store, COMMIT).await.as_ref(), b"{\"commitInfo\":{}}");
        assert_eq!(counted.take_gets(), 1);
        list(&store, "t/_delta_log").await;
        for _ in 0..3 {
            assert_eq!(read(&store, COMMIT).await.as_ref(), b"{\"commitInfo\":{}}");
        }
        assert_eq!(counted.take_gets(), 0);
        // the served metadata is the listed one
        let listed = counted.head(&Path::from(COMMIT)).await.expect("head");
        counted.take_gets();
        let served = store.get(&Path::from(COMMIT)).await.expect("get").meta;
        assert_eq!(served, listed);
        assert_eq!(counted.take_gets(), 0);
    }

    #[tokio::test]
    async fn a_commit_file_read_whole_is_kept_and_conditional_reads_go_to_the_store() {
        let (counted, store) = cached();
        counted
            .put(&Path::from(COMMIT), PutPayload::from_static(b"abc"))
            .await
            .expect("put");
        assert_eq!(read(&store, COMMIT).await.as_ref(), b"abc");
        assert_eq!(read(&store, COMMIT).await.as_ref(), b"abc");
        assert_eq!(counted.take_gets(), 1);
        store.head(&Path::from(COMMIT)).await.expect("head");
        let options = GetOptions {
            if_none_match: Some("*".into()),
            ..Default::default()
        };
        let _ = store.get_opts(&Path::from(COMMIT), options).await;
        assert_eq!(counted.take_gets(), 2);
    }

    #[tokio::test]
    async fn a_commit_file_written_again_elsewhere_is_read_from_the_store() {
        let (counted, store) = cached();
        let path = Path::from(COMMIT);
        store
            .put(&path, PutPayload::from_static(b"old"))
            .await
            .expect("put");
        list(&store, "t/_delta_log").await;
        // another writer drops the table and commits again at the same path
        counted.delete(&path).await.expect("delete");
        counted
            .put(&path, PutPayload::from_static(b"new!"))
            .await
            .expect("put");
        list(&store, "t/_delta_log").await;
        assert_eq!(read(&store, COMMIT).await.as_ref(), b"new!");
        assert_eq!(counted.take_gets(), 1);
        // deleting through the cache forgets the file
        store.delete(&path).await.expect("delete");
        assert!(store.get(&path).await.is_err());
    }

    #[tokio::test]
    async fn a_deletion_vector_written_is_read_from_memory_whole_or_in_ranges() {
        let (counted, store) = cached();
        let path = Path::from(VECTOR);
        store
            .put(&path, PutPayload::from_static(b"0123456789"))
            .await
            .expect("put");
        assert_eq!(
            store.get_range(&path, 2..5).await.expect("range").as_ref(),
            b"234"
        );
        let suffix = GetOptions {
            range: Some(GetRange::Suffix(3)),
            ..Default::default()
        };
        let served = store.get_opts(&path, suffix).await.expect("suffix");
        assert_eq!(served.range, 7..10);
        assert_eq!(served.bytes().await.expect("bytes").as_ref(), b"789");
        assert_eq!(read(&store, VECTOR).await.as_ref(), b"0123456789");
        assert_eq!(counted.take_gets(), 0);
        // an invalid range is the store's to answer
        assert!(store.get_range(&path, 20..30).await.is_err());
        assert_eq!(counted.take_gets(), 1);
    }

    #[tokio::test]
    async fn ranges_of_a_data_file_go_to_the_stores_own_get_ranges() {
        let (counted, store) = cached();
        let data = Path::from("t/part-0.zstd.parquet");
        store
            .put(&data, PutPayload::from_static(b"0123456789"))
            .await
            .expect("put");
        let ranges = [1..3, 5..6, 8..10];
        let read = store.get_ranges(&data, &ranges).await.expect("ranges");
        assert_eq!(read, [&b"12"[..], b"5", b"89"]);
        // one call of the store's own, which reads them as it does best
        assert_eq!(counted.range_calls(), 1);
        counted.take_gets();
        // a kept file's ranges are served from memory
        let vector = Path::from(VECTOR);
        store
            .put(&vector, PutPayload::from_static(b"0123456789"))
            .await
            .expect("put");
        counted.take_gets();
        let read = store.get_ranges(&vector, &ranges).await.expect("ranges");
        assert_eq!(read, [&b"12"[..], b"5", b"89"]);
        assert_eq!((counted.range_calls(), counted.take_gets()), (1, 0));
    }

    /// Lists `t/_delta_log` from version `from`'s prefix; the names listed.
    async fn list_from(store: &dyn ObjectStore, from: u64) -> Vec<String> {
        let offset = Path::from(format!("t/_delta_log/{from:020}"));
        let listed: Vec<ObjectMeta> = store
            .list_with_offset(Some(&Path::from("t/_delta_log")), &offset)
            .try_collect()
            .await
            .expect("list");
        listed
            .into_iter()
            .map(|m| m.location.filename().unwrap_or_default().to_string())
            .collect()
    }

    fn commit_at(version: u64) -> Path {
        Path::from(format!("t/_delta_log/{version:020}.json"))
    }

    async fn put_if_absent(store: &dyn ObjectStore, version: u64) -> object_store::Result<()> {
        let payload = PutPayload::from(format!("{{\"v\":{version}}}"));
        let opts = PutOptions::from(PutMode::Create);
        store.put_opts(&commit_at(version), payload, opts).await?;
        Ok(())
    }

    #[tokio::test]
    async fn the_listing_after_a_commit_is_answered_from_the_one_before() {
        let (counted, store) = cached();
        for version in 0..3 {
            put_if_absent(counted.as_ref(), version).await.expect("put");
        }
        let names = |versions: &[u64]| -> Vec<String> {
            versions.iter().map(|v| format!("{v:020}.json")).collect()
        };
        // a table loaded (listed from version 1), then deltalake's commit:
        // the latest version from the version read (made from 1: one
        // listing either way), the put, the new version loaded
        assert_eq!(list_from(&store, 1).await, names(&[1, 2]));
        assert_eq!(list_from(&store, 2).await, names(&[2]));
        assert_eq!(counted.take_lists(), 2);
        put_if_absent(&store, 3).await.expect("put");
        assert_eq!(list_from(&store, 1).await, names(&[1, 2, 3]));
        assert_eq!(counted.take_lists(), 0);
        // its commit file is read from memory, as after a listing
        counted.take_gets();
        assert_eq!(
            read(&store, "t/_delta_log/00000000000000000003.json")
                .await
                .as_ref(),
            b"{\"v\":3}"
        );
        assert_eq!(counted.take_gets(), 0);
        // once: the next listing goes to the store
        assert_eq!(list_from(&store, 1).await, names(&[1, 2, 3]));
        assert_eq!(counted.take_lists(), 1);
    }

    #[tokio::test]
    async fn a_commit_lost_to_another_writer_leaves_every_listing_to_the_store() {
        let (counted, store) = cached();
        for version in 0..3 {
            put_if_absent(counted.as_ref(), version).await.expect("put");
        }
        assert_eq!(list_from(&store, 1).await.len(), 2);
        // another writer commits 3 first; ours fails, and the retry's
        // listing sees 3 (and so does the listing after our commit 4)
        put_if_absent(counted.as_ref(), 3).await.expect("put");
        assert!(put_if_absent(&store, 3).await.is_err());
        counted.take_lists();
        assert_eq!(list_from(&store, 2).await.len(), 2);
        assert_eq!(counted.take_lists(), 1);
        put_if_absent(&store, 4).await.expect("put");
        // another writer's 5, after ours: left out, as in a listing made
        // the moment our put returned
        put_if_absent(counted.as_ref(), 5).await.expect("put");
        assert_eq!(list_from(&store, 2).await.len(), 3);
        assert_eq!(counted.take_lists(), 0);
        assert_eq!(list_from(&store, 2).await.len(), 4);
        assert_eq!(counted.take_lists(), 1);
    }

    #[test]
    fn ranges_closer_than_the_gap_are_read_as_one() {
        // out of order, overlapping, adjacent, and one far away
        let wanted = [40..50, 0..10, 12..20, 15..18, 100..110, 20..20];
        let merged = merge_ranges(&wanted, 2);
        assert_eq!(merged.reads, [0..20, 40..50, 100..110]);
        assert_eq!(merged.read_of, [1, 0, 0, 0, 2, 0]);
        let file: Vec<u8> = (0..120u8).collect();
        let read: Vec<Bytes> = merged
            .reads
            .iter()
            .map(|r| Bytes::copy_from_slice(&file[r.start as usize..r.end as usize]))
            .collect();
        let slices = merged.slices(&wanted, &read).expect("slices");
        for (range, bytes) in wanted.iter().zip(slices) {
            assert_eq!(
                bytes.as_ref(),
                &file[range.start as usize..range.end as usize]
            );
        }
        // a store answering short is an error, not a panic
        assert!(merged
            .slices(&wanted, &[Bytes::new(), Bytes::new(), Bytes::new()])
            .is_err());
        assert!(merged.slices(&wanted, &read[..1]).is_err());
        // and so is a range that ends before it starts
        #[allow(clippy::reversed_empty_ranges)]
        let inverted = [10..20, 12..5];
        let merged = merge_ranges(&inverted, 2);
        assert_eq!(merged.reads, vec![10..20]);
        let read = [Bytes::copy_from_slice(&file[10..20])];
        assert!(merged.slices(&inverted, &read).is_err());
    }

    #[test]
    fn kept_bytes_stay_under_the_limit_oldest_first() {
        let mut kept = Kept::new(40);
        let meta = |name: &str, size: u64| ObjectMeta {
            location: Path::from(name),
            last_modified: chrono::Utc::now(),
            size,
            e_tag: Some("e".into()),
            version: None,
        };
        kept.keep(Bytes::from_static(b"0123456789"), meta("a", 10), true);
        kept.keep(Bytes::from_static(b"0123456789"), meta("b", 10), true);
        kept.keep(Bytes::from_static(b"0123456789"), meta("c", 10), true);
        kept.keep(Bytes::from_static(b"0123456789"), meta("d", 10), true);
        assert_eq!(kept.bytes, 40);
        kept.keep(Bytes::from_static(b"0123456789"), meta("e", 10), true);
        assert_eq!(kept.bytes, 40);
        assert!(!kept.files.contains_key(&Path::from("a")));
        assert!(kept.files.contains_key(&Path::from("e")));
        // over a quarter of the limit: not kept
        kept.keep(Bytes::from_static(b"0123456789X"), meta("f", 11), true);
        assert!(!kept.files.contains_key(&Path::from("f")));
        assert_eq!(kept.bytes, 40);
        // a size that is not the bytes': not kept
        kept.keep(Bytes::from_static(b"01"), meta("g", 3), true);
        assert!(!kept.files.contains_key(&Path::from("g")));
    }
}
