//! What the Loader runs: the dataset sources (`joader-storage`) and the shared preparation
//! (`joader-pipeline`) behind the actors' `ElementSource` and `Prepare` seams.

use std::path::PathBuf;
use std::sync::Arc;

use actors::{
    Demand, DiskKeep, ElementSource, Fetch, Fetched, LoadFailure, Place, Prepare, Prepared,
};
use dataplane::element_error;
use joader_pipeline::{self as pipeline, Limits, Output, Pipeline, PipelineError};
use joader_storage::s3::{self, ObjectStores, ObjectVersion, S3Source};
use joader_storage::{self as storage, DatasetIndex, SourceSpec, StorageError};

/// A local dataset's index read through storage. An append replaces the index with the
/// grown one ([`IndexSource::replace`]): the existing ids read as before, and the loads under
/// way finish on the index they started with.
pub struct IndexSource(std::sync::RwLock<Arc<DatasetIndex>>);

impl IndexSource {
    pub fn new(index: Arc<DatasetIndex>) -> Self {
        IndexSource(std::sync::RwLock::new(index))
    }

    fn index(&self) -> Arc<DatasetIndex> {
        // A poisoned lock still holds a whole index (it is only ever swapped).
        self.0.read().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// Reads through `index` from now on (the dataset grew: `registry::append`).
    pub fn replace(&self, index: Arc<DatasetIndex>) {
        *self.0.write().unwrap_or_else(|e| e.into_inner()) = index;
    }
}

impl ElementSource for IndexSource {
    fn read(&self, element: u32) -> Result<Vec<u8>, LoadFailure> {
        self.index().read(element).map_err(|e| failure(&e))
    }

    fn label(&self, element: u32) -> i64 {
        self.index().label(element).unwrap_or(-1)
    }

    fn split(&self, element: u32, stored: Vec<u8>) -> Result<(Vec<u8>, Vec<u8>), LoadFailure> {
        split(&self.index(), element, stored)
    }
}

/// An element's stored bytes as its image and its small fields' block (`dataplane::fields`).
fn split(
    index: &DatasetIndex,
    element: u32,
    stored: Vec<u8>,
) -> Result<(Vec<u8>, Vec<u8>), LoadFailure> {
    split_with(index, element, stored, false)
}

/// [`split`] of `stored` as [`DatasetIndex::read_whole_row`] gave it (`whole`: a Parquet row's
/// fields come with its image) or as [`DatasetIndex::read`] did.
fn split_with(
    index: &DatasetIndex,
    element: u32,
    stored: Vec<u8>,
    whole: bool,
) -> Result<(Vec<u8>, Vec<u8>), LoadFailure> {
    if !index.has_small_fields() {
        return Ok((stored, Vec::new()));
    }
    let sample = if whole {
        index.split_whole(element, stored)
    } else {
        index.split(element, stored)
    }
    .map_err(|e| failure(&e))?;
    // The block stores each value's length in 32 bits (names are short by declaration).
    if let Some(f) = sample
        .fields
        .iter()
        .find(|f| u32::try_from(f.value.len()).is_err())
    {
        return Err(LoadFailure {
            code: element_error::TOO_LARGE,
            kind: "too_large".into(),
            message: format!(
                "field `{}` holds {} bytes: at most 4 GiB",
                f.name,
                f.value.len()
            ),
        });
    }
    let fields: Vec<dataplane::fields::Field<'_>> = sample
        .fields
        .iter()
        .map(|f| dataplane::fields::Field {
            name: &f.name,
            kind: match f.kind {
                storage::fields::FieldKind::Text => dataplane::fields::FieldKind::Text,
                storage::fields::FieldKind::Json => dataplane::fields::FieldKind::Json,
                storage::fields::FieldKind::Npy => dataplane::fields::FieldKind::Npy,
                _ => dataplane::fields::FieldKind::Bytes,
            },
            flags: if f.fixed_shape {
                dataplane::fields::FIXED_SHAPE
            } else {
                0
            },
            value: &f.value,
        })
        .collect();
    let mut block = Vec::with_capacity(dataplane::fields::encoded_len(&fields));
    dataplane::fields::encode(&fields, &mut block);
    Ok((sample.image, block))
}

/// An element's storage error as the element error clients receive in its place.
fn failure(e: &StorageError) -> LoadFailure {
    LoadFailure {
        code: match e.code() {
            "not_found" => element_error::NOT_FOUND,
            "bad_field" => element_error::BAD_FIELD,
            _ => element_error::IO,
        },
        kind: e.code().to_string(),
        message: e.to_string(),
    }
}

/// An `s3` dataset read through the object-store stage: the Loader hands its loads to the
/// stage ([`Fetch::fetch`]), and its decode threads get the bytes.
pub struct S3ElementSource(pub S3Source);

impl ElementSource for S3ElementSource {
    fn read(&self, element: u32) -> Result<Vec<u8>, LoadFailure> {
        self.0.read(element).map_err(|e| failure(&e))
    }

    fn label(&self, element: u32) -> i64 {
        self.0.label(element)
    }

    fn split(&self, element: u32, stored: Vec<u8>) -> Result<(Vec<u8>, Vec<u8>), LoadFailure> {
        // A Parquet row comes whole from the fetch stage: its fields with its image.
        split_with(self.0.index(), element, stored, true)
    }

    fn fetching(&self) -> Option<&dyn Fetch> {
        Some(self)
    }

    fn demand(&self) -> Option<&dyn Demand> {
        Some(self)
    }

    fn disk(&self) -> Option<&dyn DiskKeep> {
        self.0.disk_capacity().map(|_| self as &dyn DiskKeep)
    }
}

/// The disk tier's side of a preload kept on disk.
impl DiskKeep for S3ElementSource {
    fn capacity(&self) -> u64 {
        self.0.disk_capacity().unwrap_or(0)
    }

    fn holds(&self, element: u32) -> Option<u64> {
        self.0.on_disk(element)
    }

    fn flush(&self) {
        self.0.flush_disk();
    }
}

impl Fetch for S3ElementSource {
    fn fetch(&self, element: u32, done: Fetched) {
        self.0.fetch(
            element,
            Box::new(move |r, n| done(r.map_err(|e| failure(&e)), n)),
        );
    }

    fn fetch_time(&self) -> Option<std::time::Duration> {
        self.0.fetch_time()
    }

    fn fetch_ahead(&self, element: u32) {
        self.0.fetch_ahead(element);
    }
}

// What the jobs still need this epoch, for the disk tier's admission.
impl Demand for S3ElementSource {
    fn epoch_started(&self, job: u64, remaining: &roaring::RoaringBitmap) {
        self.0.epoch_started(job, remaining);
    }

    fn delivered(&self, job: u64, element: u32) {
        self.0.delivered(job, element);
    }

    fn job_closed(&self, job: u64) {
        self.0.job_closed(job);
    }
}

/// Why an `s3` source is refused when the server reads no object store.
fn no_object_store(url: &str) -> StorageError {
    StorageError::S3NotAllowed {
        url: url.to_owned(),
        reason: "this server reads no object store: start it with --allowed-s3 \
                 s3://bucket[/prefix] (or allowed_s3 in its configuration file)"
            .into(),
    }
}

/// Checks, before a dataset is created, that its source may be read: local paths under the
/// allowed roots; s3 sources well formed (else [`StorageError::S3Invalid`], whatever the
/// server's configuration), their urls under `--allowed-s3` and their endpoints configured.
pub fn check_source(
    spec: &SourceSpec,
    roots: &[PathBuf],
    objects: Option<&ObjectStores>,
) -> Result<(), StorageError> {
    match (spec, objects) {
        (
            SourceSpec::S3 {
                url,
                endpoint,
                region,
                ..
            },
            o,
        ) => {
            let (endpoint, region) = (endpoint.as_deref(), region.as_deref());
            s3::validate(url, endpoint, region)?;
            spec.check_fields()?;
            match o {
                Some(o) => {
                    let parsed = o.check(url, endpoint, region)?;
                    let SourceSpec::S3 { layout, split, .. } = spec else {
                        return Ok(());
                    };
                    o.check_patterns(&parsed, *layout, split.as_deref(), endpoint, region)
                }
                None => Err(no_object_store(url)),
            }
        }
        _ => {
            spec.check_fields()?;
            spec.check_roots(roots)
        }
    }
}

/// Indexes a source (blocking: the indexing thread). An `s3` source also gives the objects
/// it was made of (what a re-index compares).
pub fn index(
    spec: &SourceSpec,
    roots: &[PathBuf],
    objects: Option<&ObjectStores>,
    progress: &mut dyn FnMut(u64),
) -> Result<(DatasetIndex, Option<Vec<ObjectVersion>>), StorageError> {
    match (spec, objects) {
        (
            SourceSpec::S3 {
                url,
                layout,
                endpoint,
                region,
                fields,
                split,
            },
            Some(o),
        ) => o
            .index(
                url,
                (*layout, split.as_deref()),
                fields.as_ref(),
                endpoint.as_deref(),
                region.as_deref(),
                progress,
            )
            .map(|i| (i.index, Some(i.objects))),
        (SourceSpec::S3 { url, .. }, None) => Err(no_object_store(url)),
        _ => storage::index(spec, roots, progress).map(|i| (i, None)),
    }
}

/// The element reader of an indexed dataset (`versions`: an `s3` index's objects, whose
/// ETags key the disk tier). Opening an object store builds its HTTP client: call it off the
/// HTTP workers (indexing thread, start-up).
pub fn element_source(
    spec: &SourceSpec,
    objects: Option<&ObjectStores>,
    index: Arc<DatasetIndex>,
    versions: &[ObjectVersion],
) -> Result<Arc<dyn ElementSource>, StorageError> {
    match (spec, objects) {
        (
            SourceSpec::S3 {
                url,
                endpoint,
                region,
                ..
            },
            Some(o),
        ) => Ok(Arc::new(S3ElementSource(o.source(
            url,
            endpoint.as_deref(),
            region.as_deref(),
            index,
            versions,
        )?))),
        (SourceSpec::S3 { url, .. }, None) => Err(no_object_store(url)),
        _ => Ok(Arc::new(IndexSource::new(index))),
    }
}

/// A pipeline with its limits.
pub struct PipelinePrepare {
    pub pipeline: Pipeline,
    pub limits: Limits,
}

impl Prepare for PipelinePrepare {
    fn prepare(&self, bytes: &[u8]) -> Result<Prepared, LoadFailure> {
        match pipeline::decode(&self.pipeline, bytes, &self.limits).map_err(pipeline_failure)? {
            None => Ok(prepared(Output::Raw(bytes.to_vec()))),
            Some(decoded) => {
                let source = decoded.source_size();
                let mut p = prepared(decoded.finish().map_err(pipeline_failure)?);
                p.source = source;
                Ok(p)
            }
        }
    }

    /// Decodes, then resizes straight into the slot `place` gives (no copy of the output),
    /// or into a buffer when it has no room; a `raw` pipeline copies the stored bytes there.
    fn prepare_placed(&self, bytes: &[u8], place: &mut dyn Place) -> Result<Prepared, LoadFailure> {
        let Some(decoded) =
            pipeline::decode(&self.pipeline, bytes, &self.limits).map_err(pipeline_failure)?
        else {
            // `raw`: the stored bytes (none for a sample without an image) straight into the
            // slot, its fields after them, with no copy for the Cache to make.
            let format = dataplane::Format::Raw;
            let mut fill = |dst: &mut [u8]| {
                dst.copy_from_slice(bytes);
                Ok(())
            };
            return match place.place(format, (0, 0), bytes.len() as u64, &mut fill) {
                Some(placed) => Ok(Prepared {
                    bytes: Vec::new(),
                    format,
                    placed: Some(placed?),
                    fields_len: 0,
                    source: (0, 0),
                }),
                None => self.prepare(bytes),
            };
        };
        let (height, width, channels) = decoded.shape();
        let format = dataplane::Format::HwcU8 {
            height,
            width,
            channels,
        };
        let source = decoded.source_size();
        let mut fill = |dst: &mut [u8]| decoded.resize_into(dst).map_err(pipeline_failure);
        match place.place(format, source, decoded.len() as u64, &mut fill) {
            Some(placed) => Ok(Prepared {
                bytes: Vec::new(),
                format,
                placed: Some(placed?),
                fields_len: 0,
                source,
            }),
            None => {
                let mut p = prepared(decoded.finish().map_err(pipeline_failure)?);
                p.source = source;
                Ok(p)
            }
        }
    }

    fn decodes(&self) -> bool {
        !matches!(self.pipeline, Pipeline::Raw)
    }
}

/// A pipeline's output as bytes for the Cache to copy into a slot.
fn prepared(out: Output) -> Prepared {
    match out {
        Output::Raw(bytes) => Prepared::bytes(bytes, dataplane::Format::Raw),
        Output::Hwc {
            data,
            height,
            width,
            channels,
        } => Prepared::bytes(
            data,
            dataplane::Format::HwcU8 {
                height,
                width,
                channels,
            },
        ),
    }
}

/// A pipeline's error as the element's load failure.
fn pipeline_failure(e: PipelineError) -> LoadFailure {
    LoadFailure {
        code: match e {
            PipelineError::TooLarge { .. } => element_error::TOO_LARGE,
            _ => element_error::DECODE,
        },
        kind: e.code().to_string(),
        message: e.to_string(),
    }
}
