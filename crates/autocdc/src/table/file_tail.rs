//! Reading a Parquet data file's tail with one request.
//!
//! The end of a data file holds what every reader of it needs before any
//! row: the footer, the metadata, the page index and, as our writer places
//! them, the bloom filters. Read one by one, as a Parquet reader asks for
//! them, each is a request: probing a small file for keys cost five (footer
//! length, metadata, page index, bloom filters, key pages). On an object
//! store a request costs far more than the bytes it brings, so a
//! [`TailReader`] brings the last [`TAIL_BYTES`] of the file (all of a
//! smaller file) with the first request that falls there, keeps them, and
//! serves from memory every later request inside them:
//!
//! | request | served by |
//! |---|---|
//! | inside the tail held | memory |
//! | ending in the last `TAIL_BYTES`, no tail held yet | one request from its start (or the tail's, if lower) to the end of the file, then memory |
//! | anything else | the store (several ranges: coalesced by the store) |
//!
//! A small file is then one request whatever is read of it; a large one
//! needs one for its footer, metadata, page index and (most) filters, and
//! one per run of pages it reads. A reader can hand what it holds to the
//! next reader of the same file ([`TailReader::held`], [`TailReader::with`]):
//! a small file probed for keys is not read again for its rows. A writer
//! keeps the tail it wrote ([`TailCapture`]), so what a probe needs of a new
//! file is known without reading it ([`super::probe_index`]).

use std::collections::VecDeque;
use std::ops::Range;
use std::sync::Arc;

use bytes::Bytes;
use deltalake_core::parquet::arrow::arrow_reader::ArrowReaderOptions;
#[allow(deprecated)]
use deltalake_core::parquet::arrow::async_reader::{AsyncFileReader, ParquetObjectReader};
use deltalake_core::parquet::arrow::async_writer::AsyncFileWriter;
use deltalake_core::parquet::errors::Result;
use deltalake_core::parquet::file::metadata::{ParquetMetaData, ParquetMetaDataReader};
use futures::future::BoxFuture;
use futures::FutureExt;
use object_store::path::Path;
use object_store::ObjectStore;

/// Bytes read at once from the end of a file: a footer, metadata and page
/// index of many row groups, and bloom filters of small ones; all of a file
/// as small as the files of a small update.
pub(crate) const TAIL_BYTES: u64 = 256 * 1024;

/// The last bytes of a file, from `start` to its end.
#[derive(Debug, Clone)]
pub(crate) struct Tail {
    start: u64,
    bytes: Bytes,
}

impl Tail {
    /// Size of the file these bytes end.
    pub(crate) fn file_size(&self) -> u64 {
        self.start + self.bytes.len() as u64
    }

    /// The bytes held: the file's last.
    pub(crate) fn bytes(&self) -> &Bytes {
        &self.bytes
    }

    /// The bytes of the file at `range`, if all are held.
    pub(crate) fn slice(&self, range: &Range<u64>) -> Option<Bytes> {
        if range.start < self.start || range.start > range.end {
            return None;
        }
        let from = usize::try_from(range.start - self.start).ok()?;
        let to = usize::try_from(range.end - self.start).ok()?;
        (to <= self.bytes.len()).then(|| self.bytes.slice(from..to))
    }

    /// Whether these are all of the file's bytes.
    pub(crate) fn is_whole_file(&self) -> bool {
        self.start == 0
    }

    /// Bytes held.
    pub(crate) fn len(&self) -> usize {
        self.bytes.len()
    }
}

/// A Parquet reader of one file that reads its tail once (module docs).
///
/// It wraps `ParquetObjectReader`, deprecated in favour of engine-specific
/// readers: DataFusion's own Parquet reader wraps it the same way.
#[allow(deprecated)]
pub(crate) struct TailReader {
    inner: ParquetObjectReader,
    size: u64,
    tail: Option<Tail>,
}

#[allow(deprecated)]
impl TailReader {
    /// A reader of the file `path` of `size` bytes in `store`.
    pub(crate) fn new(store: &Arc<dyn ObjectStore>, path: &Path, size: u64) -> Self {
        Self {
            inner: ParquetObjectReader::new(Arc::clone(store), path.clone()).with_file_size(size),
            size,
            tail: None,
        }
    }

    /// This reader, holding `tail` (another reader's of the same file).
    pub(crate) fn with(mut self, tail: Option<Tail>) -> Self {
        self.tail = tail;
        self
    }

    /// The tail this reader holds, if it has read it.
    pub(crate) fn held(&self) -> Option<Tail> {
        self.tail.clone()
    }

    /// `range`, from the tail held, if it holds all of it.
    fn slice(&self, range: &Range<u64>) -> Option<Bytes> {
        self.tail.as_ref()?.slice(range)
    }

    /// Where the tail to read for `range` starts, when `range` ends in the
    /// file's last [`TAIL_BYTES`] and no tail is held yet.
    fn tail_start(&self, range: &Range<u64>) -> Option<u64> {
        let zone = self.size.saturating_sub(TAIL_BYTES);
        (self.tail.is_none() && range.end > zone && range.end <= self.size)
            .then(|| range.start.min(zone))
    }
}

#[allow(deprecated)]
impl AsyncFileReader for TailReader {
    fn get_bytes(&mut self, range: Range<u64>) -> BoxFuture<'_, Result<Bytes>> {
        async move {
            if let Some(bytes) = self.slice(&range) {
                return Ok(bytes);
            }
            if let Some(start) = self.tail_start(&range) {
                let bytes = self.inner.get_bytes(start..self.size).await?;
                self.tail = Some(Tail { start, bytes });
                if let Some(bytes) = self.slice(&range) {
                    return Ok(bytes);
                }
            }
            self.inner.get_bytes(range).await
        }
        .boxed()
    }

    fn get_byte_ranges(&mut self, ranges: Vec<Range<u64>>) -> BoxFuture<'_, Result<Vec<Bytes>>> {
        async move {
            let held: Vec<Option<Bytes>> = ranges.iter().map(|r| self.slice(r)).collect();
            let missing: Vec<Range<u64>> = ranges
                .iter()
                .zip(&held)
                .filter(|(_, held)| held.is_none())
                .map(|(r, _)| r.clone())
                .collect();
            if missing.is_empty() {
                return Ok(held.into_iter().flatten().collect());
            }
            let mut fetched = self.inner.get_byte_ranges(missing).await?.into_iter();
            held.into_iter()
                .map(|held| match held {
                    Some(bytes) => Ok(bytes),
                    None => fetched.next().ok_or_else(|| {
                        deltalake_core::parquet::errors::ParquetError::General(
                            "the store returned fewer ranges than asked".into(),
                        )
                    }),
                })
                .collect()
        }
        .boxed()
    }

    fn get_metadata<'a>(
        &'a mut self,
        options: Option<&'a ArrowReaderOptions>,
    ) -> BoxFuture<'a, Result<Arc<ParquetMetaData>>> {
        async move {
            let mut reader = ParquetMetaDataReader::new();
            if let Some(options) = options {
                reader = reader
                    .with_metadata_options(Some(options.metadata_options().clone()))
                    .with_column_index_policy(options.column_index_policy())
                    .with_offset_index_policy(options.offset_index_policy());
            }
            // (every fetch goes through `get_bytes`: the first brings the tail)
            let size = self.size;
            Ok(Arc::new(reader.load_and_finish(self, size).await?))
        }
        .boxed()
    }
}

/// A writer of a Parquet file that keeps the last [`TAIL_BYTES`] it wrote
/// (copies: a slice would keep a whole row group's buffer alive).
pub(crate) struct TailCapture<W> {
    inner: W,
    chunks: VecDeque<Bytes>,
    held: usize,
    written: u64,
}

impl<W> TailCapture<W> {
    /// `inner`, its tail kept.
    pub(crate) fn new(inner: W) -> Self {
        Self {
            inner,
            chunks: VecDeque::new(),
            held: 0,
            written: 0,
        }
    }

    fn keep(&mut self, bytes: &Bytes) {
        let limit = TAIL_BYTES as usize;
        self.written += bytes.len() as u64;
        if bytes.len() >= limit {
            self.chunks.clear();
            self.chunks
                .push_back(Bytes::copy_from_slice(&bytes[bytes.len() - limit..]));
            self.held = limit;
            return;
        }
        self.chunks.push_back(Bytes::copy_from_slice(bytes));
        self.held += bytes.len();
        while let Some(front) = self.chunks.front() {
            if self.held - front.len() < limit {
                break;
            }
            self.held -= front.len();
            self.chunks.pop_front();
        }
    }

    /// The end of what was written: at least its last [`TAIL_BYTES`] (all
    /// of a smaller file).
    pub(crate) fn tail(&self) -> Tail {
        let mut bytes = Vec::with_capacity(self.held);
        for chunk in &self.chunks {
            bytes.extend_from_slice(chunk);
        }
        Tail {
            start: self.written - self.held as u64,
            bytes: Bytes::from(bytes),
        }
    }
}

impl<W: AsyncFileWriter> AsyncFileWriter for TailCapture<W> {
    fn write(&mut self, bytes: Bytes) -> BoxFuture<'_, Result<()>> {
        self.keep(&bytes);
        self.inner.write(bytes)
    }

    fn complete(&mut self) -> BoxFuture<'_, Result<()>> {
        self.inner.complete()
    }
}

#[cfg(test)]
mod tests {
    use super::super::counted_store::Counted;
    use super::*;
    use arrow::array::{Int64Array, RecordBatch};
    use arrow::datatypes::{DataType, Field, Schema};
    use deltalake_core::parquet::arrow::arrow_reader::ArrowReaderMetadata;
    use deltalake_core::parquet::arrow::{ArrowWriter, ParquetRecordBatchStreamBuilder};
    use deltalake_core::parquet::file::metadata::PageIndexPolicy;
    use deltalake_core::parquet::file::properties::WriterProperties;
    use futures::TryStreamExt;
    use object_store::{ObjectStoreExt, PutPayload};

    /// A file of `rows` ids in row groups of `group` rows, in `store`.
    async fn file(store: &Arc<dyn ObjectStore>, rows: i64, group: usize) -> (Path, u64) {
        let schema = Arc::new(Schema::new(vec![Field::new("id", DataType::Int64, false)]));
        let batch = RecordBatch::try_new(
            Arc::clone(&schema),
            vec![Arc::new(Int64Array::from_iter_values(0..rows))],
        )
        .expect("batch");
        let properties = WriterProperties::builder()
            .set_max_row_group_row_count(Some(group))
            .build();
        let mut buffer = Vec::new();
        let mut writer =
            ArrowWriter::try_new(&mut buffer, schema, Some(properties)).expect("writer");
        writer.write(&batch).expect("write");
        writer.close().expect("close");
        let (path, size) = (Path::from("f.parquet"), buffer.len() as u64);
        store
            .put(&path, PutPayload::from(buffer))
            .await
            .expect("put");
        (path, size)
    }

    async fn read_all(reader: TailReader) -> i64 {
        let options = ArrowReaderOptions::new().with_page_index_policy(PageIndexPolicy::Optional);
        let mut reader = reader;
        let metadata = ArrowReaderMetadata::load_async(&mut reader, options)
            .await
            .expect("metadata");
        let batches: Vec<RecordBatch> =
            ParquetRecordBatchStreamBuilder::new_with_metadata(reader, metadata)
                .build()
                .expect("stream")
                .try_collect()
                .await
                .expect("rows");
        batches
            .iter()
            .flat_map(|b| {
                b.column(0)
                    .as_any()
                    .downcast_ref::<Int64Array>()
                    .map(|a| a.values().to_vec())
                    .unwrap_or_default()
            })
            .sum()
    }

    #[tokio::test]
    async fn a_small_file_is_one_request_and_a_large_one_reads_its_tail_once() {
        let counted = Arc::new(Counted::default());
        let store: Arc<dyn ObjectStore> = Arc::clone(&counted) as _;
        // small: metadata, page index and every page in one request
        let (path, size) = file(&store, 1000, 100).await;
        assert!(size < TAIL_BYTES);
        assert_eq!(
            read_all(TailReader::new(&store, &path, size)).await,
            499_500
        );
        assert_eq!(counted.take_gets(), 1);
        // large: the tail once (footer, metadata, page index), then pages
        let (path, size) = file(&store, 200_000, 100_000).await;
        assert!(size > TAIL_BYTES);
        let mut reader = TailReader::new(&store, &path, size);
        let options = ArrowReaderOptions::new().with_page_index_policy(PageIndexPolicy::Optional);
        let metadata = ArrowReaderMetadata::load_async(&mut reader, options)
            .await
            .expect("metadata");
        assert!(metadata.metadata().offset_index().is_some());
        assert_eq!(counted.take_gets(), 1);
        assert!(reader.held().is_some_and(|t| !t.is_whole_file()));
        // a range straddling the start of the tail held is read from the store
        let start = size - TAIL_BYTES;
        let bytes = reader
            .get_bytes(start - 10..start + 10)
            .await
            .expect("bytes");
        let whole = store
            .get(&path)
            .await
            .expect("get")
            .bytes()
            .await
            .expect("bytes");
        assert_eq!(
            bytes,
            whole.slice((start - 10) as usize..(start + 10) as usize)
        );
        // ranges inside it are not
        counted.take_gets();
        let ranges = reader
            .get_byte_ranges(vec![size - 8..size, start..start + 4])
            .await
            .expect("ranges");
        assert_eq!(ranges[0], whole.slice((size - 8) as usize..size as usize));
        assert_eq!(ranges[1], whole.slice(start as usize..start as usize + 4));
        assert_eq!(counted.gets(), 0);
        assert_eq!(
            read_all(TailReader::new(&store, &path, size)).await,
            199_999 * 200_000 / 2
        );
    }

    #[tokio::test]
    async fn a_writer_keeps_the_last_bytes_it_wrote() {
        for rows in [1_000i64, 400_000] {
            let schema = Arc::new(Schema::new(vec![Field::new("id", DataType::Int64, false)]));
            let batch = RecordBatch::try_new(
                Arc::clone(&schema),
                vec![Arc::new(Int64Array::from_iter_values(0..rows))],
            )
            .expect("batch");
            let mut writer = deltalake_core::parquet::arrow::AsyncArrowWriter::try_new(
                TailCapture::new(Vec::<u8>::new()),
                schema,
                None,
            )
            .expect("writer");
            writer.write(&batch).await.expect("write");
            writer.finish().await.expect("finish");
            let capture = writer.into_inner();
            let (tail, file) = (capture.tail(), &capture.inner);
            assert_eq!(tail.file_size(), file.len() as u64);
            assert_eq!(tail.bytes().as_ref(), &file[file.len() - tail.len()..]);
            assert_eq!(tail.is_whole_file(), file.len() as u64 <= TAIL_BYTES);
            assert_eq!(tail.len() as u64, (file.len() as u64).min(TAIL_BYTES));
        }
    }
}
