//! A row group's image column decoded by the `parquet` crate, and where each of its values
//! lies in the file: the crate reads the column chunk from memory ([`Chunk`]), noting each
//! page's place ([`Capture`]), and [`locate`] finds every value in its page.

use std::sync::{Arc, Mutex};

use bytes::{Buf, Bytes};
use parquet::basic::Compression;
use parquet::column::page::{Page, PageMetadata, PageReader};
use parquet::column::reader::ColumnReaderImpl;
use parquet::data_type::{ByteArray, ByteArrayType};
use parquet::errors::ParquetError;
use parquet::file::reader::{ChunkReader, Length};
use parquet::file::serialized_reader::SerializedPageReader;

use super::input::{OpenFile, lock};
use super::snappy::{self, Span};

/// Where a row's image bytes are.
#[derive(Clone, Copy, Debug)]
pub(super) enum Row {
    /// The `bytes` leaf is null (the image may be a `path`).
    Null,
    /// `len` bytes at `at` in the stream of page `page`; `span` is the piece of a Snappy
    /// stream that produces them.
    Value {
        page: u32,
        at: u32,
        len: u32,
        span: Span,
    },
}

/// A page's payload as the file holds it.
#[derive(Clone, Copy, Debug)]
pub(super) struct Stream {
    /// Where it begins in the file.
    pub(super) offset: u64,
    pub(super) snappy: bool,
}

/// A row group whose rows are located.
pub(super) struct Directory {
    pub(super) streams: Vec<Stream>,
    pub(super) rows: Vec<Row>,
}

impl Directory {
    pub(super) fn cost(&self) -> usize {
        self.rows.len() * size_of::<Row>() + self.streams.len() * size_of::<Stream>()
    }
}

/// A row group's image column as the crate decoded it.
pub(super) struct Decoded {
    /// The column chunk as read.
    pub(super) chunk: Arc<Chunk>,
    /// Its pages, decompressed.
    pub(super) pages: Vec<CapturedPage>,
    /// Each row's value (`None`: null).
    pub(super) rows: Vec<Option<ByteArray>>,
    pub(super) codec: Compression,
}

/// Reads row group `group`'s image column chunk (one read) and decodes it.
pub(super) fn decode(file: &OpenFile, group: u32) -> Result<Decoded, String> {
    let image = file
        .image
        .as_ref()
        .ok_or("the dataset's rows have no image column")?;
    let meta = file.meta.row_group(group as usize);
    let chunk_meta = meta.column(image.bytes);
    let (start, len) = chunk_meta.byte_range();
    let bytes = Bytes::from(file.file.read_range(start, len as usize)?);
    let chunk = Arc::new(Chunk {
        start,
        bytes,
        requests: Mutex::new(Vec::new()),
    });
    let rows = usize::try_from(meta.num_rows()).unwrap_or(0);
    let pages = SerializedPageReader::new(chunk.clone(), chunk_meta, rows, None)
        .map_err(|e| e.to_string())?;
    let capture = Capture {
        inner: pages,
        chunk: chunk.clone(),
        pages: Arc::new(Mutex::new(Vec::new())),
        requests_seen: 0,
    };
    let captured = capture.pages.clone();
    let descr = meta.schema_descr().column(image.bytes);
    let max_def = descr.max_def_level();
    let mut column = ColumnReaderImpl::<ByteArrayType>::new(descr, Box::new(capture));
    let mut decoded: Vec<Option<ByteArray>> = Vec::with_capacity(rows);
    let (mut defs, mut values) = (Vec::new(), Vec::new());
    while decoded.len() < rows {
        defs.clear();
        values.clear();
        let (records, _, _) = column
            .read_records(rows - decoded.len(), Some(&mut defs), None, &mut values)
            .map_err(|e| e.to_string())?;
        if records == 0 {
            return Err(fewer_rows());
        }
        if max_def == 0 {
            decoded.extend(values.drain(..).map(Some));
        } else {
            let mut v = values.drain(..);
            for &d in &defs[..records] {
                decoded.push(if d == max_def { v.next() } else { None });
            }
        }
    }
    drop(column);
    let pages = std::mem::take(&mut *lock(&captured));
    Ok(Decoded {
        chunk,
        pages,
        rows: decoded,
        codec: chunk_meta.compression(),
    })
}

/// The error of a row group shorter than the index says.
pub(super) fn fewer_rows() -> String {
    "the row group has fewer rows than the index says (the file changed since indexing?)".into()
}

/// Where each value of a decoded group lies in its pages' payloads, when every one can be
/// found there and every page holding one is Snappy or uncompressed (else `None`: the group
/// is read from its decoded column).
///
/// The `parquet` crate's decoders hand out values as slices of the decompressed page
/// (`Bytes::slice`, for PLAIN values and the dictionary's); a value that is such a slice
/// gives its page and position by its address within the page's buffer.
pub(super) fn locate(
    chunk: &Chunk,
    pages: &[CapturedPage],
    decoded: &[Option<ByteArray>],
    codec: Compression,
) -> Option<Directory> {
    let snappy = match codec {
        Compression::SNAPPY => true,
        Compression::UNCOMPRESSED => false,
        _ => return None,
    };
    let within = |p: &CapturedPage, v: &[u8]| {
        let (base, at) = (p.buf.as_ptr() as usize, v.as_ptr() as usize);
        (at >= base + p.prefix && at + v.len() <= base + p.buf.len()).then(|| at - base - p.prefix)
    };
    let mut rows = Vec::with_capacity(decoded.len());
    let mut used = vec![false; pages.len()];
    let mut found = Vec::with_capacity(decoded.len());
    for value in decoded {
        let Some(v) = value else {
            found.push(None);
            continue;
        };
        if v.is_empty() {
            // An empty slice need not point into its page (`Bytes` makes it static).
            found.push(Some((0, 0, 0)));
            continue;
        }
        let (page, at) = pages
            .iter()
            .enumerate()
            .find_map(|(i, p)| within(p, v.data()).map(|at| (i, at)))?;
        used[page] = true;
        found.push(Some((page, at, v.len())));
    }
    let mut streams = Vec::with_capacity(pages.len());
    let mut elements = Vec::with_capacity(pages.len());
    for (p, &used) in pages.iter().zip(&used) {
        let offset = p.offset + p.prefix as u64;
        let compressed = snappy && p.compressed;
        streams.push(Stream {
            offset,
            snappy: compressed,
        });
        if !(used && compressed) {
            elements.push(Vec::new());
            continue;
        }
        let from = usize::try_from(offset - chunk.start).ok()?;
        let payload = chunk.bytes.get(from..from + (p.len - p.prefix))?;
        // The crate decompressed this stream into `buf`: its elements say where each byte
        // of `buf` comes from.
        let (len, e) = snappy::elements(payload).ok()?;
        if len != p.buf.len() - p.prefix {
            return None;
        }
        elements.push(e);
    }
    for f in found {
        rows.push(match f {
            None => Row::Null,
            Some((page, at, len)) => {
                let (at, len) = (u32::try_from(at).ok()?, u32::try_from(len).ok()?);
                let span = if streams[page].snappy && len > 0 {
                    snappy::span(&elements[page], at, at + len)
                } else {
                    Span::default()
                };
                Row::Value {
                    page: page as u32,
                    at,
                    len,
                    span,
                }
            }
        });
    }
    Some(Directory { streams, rows })
}

/// A page as the crate decoded it, and where its payload lies in the file.
pub(super) struct CapturedPage {
    /// The payload's offset in the file and its length (as stored).
    offset: u64,
    len: usize,
    /// The decompressed page.
    pub(super) buf: Bytes,
    /// Bytes at the start of the payload (and of `buf`) that are not compressed: a v2
    /// page's levels.
    prefix: usize,
    /// Whether the rest is compressed by the chunk's codec.
    compressed: bool,
}

/// A column chunk in memory, served at its file offsets; each `get_bytes` (a page's
/// payload) is noted, so that a decoded page can be matched with its place in the file.
pub(super) struct Chunk {
    start: u64,
    pub(super) bytes: Bytes,
    requests: Mutex<Vec<(u64, usize)>>,
}

impl Chunk {
    fn slice(&self, start: u64, len: usize) -> parquet::errors::Result<Bytes> {
        let from = start
            .checked_sub(self.start)
            .and_then(|f| usize::try_from(f).ok())
            .filter(|&f| f.checked_add(len).is_some_and(|e| e <= self.bytes.len()))
            .ok_or_else(|| {
                ParquetError::EOF(format!(
                    "{len} bytes at {start} lie outside the column chunk (damaged?)"
                ))
            })?;
        Ok(self.bytes.slice(from..from + len))
    }
}

impl Length for Chunk {
    fn len(&self) -> u64 {
        self.start + self.bytes.len() as u64
    }
}

impl ChunkReader for Chunk {
    type T = bytes::buf::Reader<Bytes>;

    fn get_read(&self, start: u64) -> parquet::errors::Result<Self::T> {
        let rest = (self.len()).saturating_sub(start);
        Ok(self.slice(start, rest as usize)?.reader())
    }

    fn get_bytes(&self, start: u64, length: usize) -> parquet::errors::Result<Bytes> {
        let bytes = self.slice(start, length)?;
        lock(&self.requests).push((start, length));
        Ok(bytes)
    }
}

/// The crate's page reader, noting each page it returns with its place in the file.
struct Capture {
    inner: SerializedPageReader<Chunk>,
    chunk: Arc<Chunk>,
    pages: Arc<Mutex<Vec<CapturedPage>>>,
    requests_seen: usize,
}

impl Iterator for Capture {
    type Item = parquet::errors::Result<Page>;

    fn next(&mut self) -> Option<Self::Item> {
        self.get_next_page().transpose()
    }
}

impl PageReader for Capture {
    fn get_next_page(&mut self) -> parquet::errors::Result<Option<Page>> {
        let page = self.inner.get_next_page()?;
        let requests = lock(&self.chunk.requests);
        let new = &requests[self.requests_seen.min(requests.len())..];
        if let (Some(page), [(offset, len)]) = (&page, new) {
            let (prefix, compressed) = match page {
                Page::DataPageV2 {
                    def_levels_byte_len,
                    rep_levels_byte_len,
                    is_compressed,
                    ..
                } => (
                    (*def_levels_byte_len + *rep_levels_byte_len) as usize,
                    *is_compressed,
                ),
                _ => (0, true),
            };
            if prefix <= *len && prefix <= page.buffer().len() {
                lock(&self.pages).push(CapturedPage {
                    offset: *offset,
                    len: *len,
                    buf: page.buffer().clone(),
                    prefix,
                    compressed,
                });
            }
        }
        self.requests_seen = requests.len();
        Ok(page)
    }

    fn peek_next_page(&mut self) -> parquet::errors::Result<Option<PageMetadata>> {
        self.inner.peek_next_page()
    }

    fn skip_next_page(&mut self) -> parquet::errors::Result<()> {
        self.inner.skip_next_page()
    }

    fn at_record_boundary(&mut self) -> parquet::errors::Result<bool> {
        self.inner.at_record_boundary()
    }
}
