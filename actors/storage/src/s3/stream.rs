//! A blocking reader of one object's bytes for the indexers ([`StreamRead`]): a tar shard or
//! a manifest is read as one streaming GET, resumed where it broke.

use std::io::Read;
use std::time::Instant;

use futures::StreamExt;
use futures::stream::BoxStream;
use object_store::{GetOptions, GetRange, ObjectMeta, ObjectStore};

use super::dataset::object_key;
use super::{ObjectStores, Op, S3Dataset};

/// A blocking reader of one object's bytes, streamed by the fetch stage's runtime (the
/// indexing thread is no async context). A stream that breaks resumes with a ranged GET
/// from where it stopped, on the listed ETag, until no byte has come for the retry budget.
pub(super) struct StreamRead<'a> {
    stores: &'a ObjectStores,
    ds: &'a S3Dataset,
    key: String,
    etag: Option<String>,
    size: u64,
    pos: u64,
    stream: Option<BoxStream<'static, object_store::Result<bytes::Bytes>>>,
    buf: bytes::Bytes,
    progressed: Instant,
}

impl<'a> StreamRead<'a> {
    pub(super) fn new(stores: &'a ObjectStores, ds: &'a S3Dataset, meta: &ObjectMeta) -> Self {
        Self {
            stores,
            ds,
            key: meta.location.to_string(),
            etag: meta.e_tag.clone(),
            size: meta.size,
            pos: 0,
            stream: None,
            buf: Default::default(),
            progressed: Instant::now(),
        }
    }
}

impl Read for StreamRead<'_> {
    fn read(&mut self, out: &mut [u8]) -> std::io::Result<usize> {
        loop {
            if !self.buf.is_empty() {
                let n = out.len().min(self.buf.len());
                out[..n].copy_from_slice(&self.buf[..n]);
                let _ = self.buf.split_to(n);
                self.pos += n as u64;
                return Ok(n);
            }
            if self.pos >= self.size {
                return Ok(0);
            }
            let remote = self.stores.remote();
            if self.stream.is_none() {
                let options = GetOptions {
                    range: Some(GetRange::Offset(self.pos)),
                    if_match: self.etag.clone(),
                    ..GetOptions::default()
                };
                let key = object_key(&self.key);
                let ds = self.ds;
                let got = self
                    .stores
                    .block_on(remote.call(ds, &self.key, Op::Get, || {
                        ds.store.get_opts(&key, options.clone())
                    }))
                    .map_err(std::io::Error::other)?;
                self.stream = Some(got.into_stream());
            }
            let next = self
                .stores
                .block_on(self.stream.as_mut().expect("opened above").next());
            match next {
                Some(Ok(bytes)) => {
                    remote
                        .stats()
                        .bytes
                        .fetch_add(bytes.len() as u64, std::sync::atomic::Ordering::Relaxed);
                    self.buf = bytes;
                    self.progressed = Instant::now();
                }
                Some(Err(e)) => {
                    self.stream = None;
                    if self.progressed.elapsed() > self.stores.config().budget {
                        return Err(std::io::Error::other(self.ds.redact(&e.to_string())));
                    }
                    remote
                        .stats()
                        .retries
                        .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                }
                None => {
                    self.stream = None;
                    if self.progressed.elapsed() > self.stores.config().budget {
                        return Err(std::io::Error::new(
                            std::io::ErrorKind::UnexpectedEof,
                            "the object stream ended early",
                        ));
                    }
                }
            }
        }
    }
}
