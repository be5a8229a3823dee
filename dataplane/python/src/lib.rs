//! `joader._native`: the Rust half of the `joader` Python package.
//!
//! Thin bindings over `dataplane::RawReader`: waiting releases the GIL, and
//! batches are described by plain Python values (ids, labels, lengths,
//! shapes). NumPy arrays cross the boundary through rust-numpy only: views of
//! shared memory are made here (read-only, with the mapping as their base),
//! and collation writes into arrays whose dtype, shape, contiguity and
//! writability are checked here, so no raw address ever comes from Python.
#![deny(unsafe_code)]

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use dataplane::augment::{Output, RandomResizedCrop};
use dataplane::prefetch::{BatchBuf, PrefetchConfig, Sender};
use dataplane::{DataKeepAlive, Format, ItemMeta, RawBatch, RawReader};
use numpy::ndarray::{ArrayView, IxDyn};
use numpy::{
    Element, PyArray, PyArrayDescrMethods, PyArrayDyn, PyArrayMethods, PyReadwriteArrayDyn,
    PyUntypedArray, PyUntypedArrayMethods,
};
use pyo3::exceptions::{PyException, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList};

pyo3::create_exception!(
    _native,
    JoaderError,
    PyException,
    "Error of the joader data plane or server; `args` is `(code, message)`."
);

fn err(e: dataplane::Error) -> PyErr {
    JoaderError::new_err((e.code(), e.to_string()))
}

fn closed() -> PyErr {
    JoaderError::new_err(("reader_closed", "the reader is closed"))
}

/// Keeps the read-only data mapping alive while NumPy views of it exist.
#[pyclass(module = "joader._native", frozen)]
struct KeepAlive {
    _inner: DataKeepAlive,
}

/// Low-level reader of one delivery ring (see `joader.RingReader`).
#[pyclass(module = "joader._native")]
struct RingReader {
    inner: Option<RawReader>,
    batches: HashMap<u64, RawBatch>,
    keep: Option<Py<KeepAlive>>,
}

impl RingReader {
    fn reader(&self) -> PyResult<&RawReader> {
        self.inner.as_ref().ok_or_else(closed)
    }

    fn batch(&self, start: u64) -> PyResult<&RawBatch> {
        self.batches.get(&start).ok_or_else(|| {
            JoaderError::new_err(("batch_released", "the batch was already acknowledged"))
        })
    }
}

/// Borrows `a` for writing after checking that it is a NumPy array of
/// element type `T`, of exactly `shape`, C-contiguous and writeable; any
/// mismatch is a `ValueError` naming `what`, what was expected and what came.
fn out_array<'py, T: Element>(
    a: &Bound<'py, PyAny>,
    what: &str,
    shape: &[usize],
) -> PyResult<PyReadwriteArrayDyn<'py, T>> {
    let py = a.py();
    let bad = |msg: String| PyValueError::new_err(format!("{what}: {msg}"));
    let arr = a.cast::<PyUntypedArray>().map_err(|_| {
        let ty = a
            .get_type()
            .name()
            .map_or_else(|_| "?".to_string(), |n| n.to_string());
        bad(format!("expected a numpy.ndarray, got {ty}"))
    })?;
    let want = numpy::dtype::<T>(py);
    if !arr.dtype().is_equiv_to(&want) {
        return Err(bad(format!("expected dtype {want}, got {}", arr.dtype())));
    }
    if arr.shape() != shape {
        return Err(bad(format!(
            "expected shape {shape:?}, got {:?}",
            arr.shape()
        )));
    }
    if !arr.is_c_contiguous() {
        return Err(bad("the array must be C-contiguous".into()));
    }
    let typed = arr
        .cast::<PyArrayDyn<T>>()
        .map_err(|e| bad(e.to_string()))?;
    // Fails when the array is read-only, or already borrowed by Rust code
    // (e.g. the images and the labels are the same array).
    typed
        .try_readwrite()
        .map_err(|e| bad(format!("the array must be writeable and not in use ({e})")))
}

/// Zero-copy read-only view of an item: `(H, W, C)` for images, `(len,)` for raw bytes.
fn view<'py>(
    py: Python<'py>,
    raw: &RawReader,
    keep: &Py<KeepAlive>,
    item: &ItemMeta,
) -> PyResult<Bound<'py, PyAny>> {
    let bytes = raw.bytes(item);
    let shape: Vec<usize> = match item.format {
        Format::HwcU8 {
            height,
            width,
            channels,
        } => vec![height as usize, width as usize, channels as usize],
        Format::Raw => vec![bytes.len()],
    };
    let nd = ArrayView::from_shape(IxDyn(&shape), bytes)
        .map_err(|e| JoaderError::new_err(("collate", e.to_string())))?;
    let arr = shared_view(&nd, keep.bind(py).clone().into_any());
    // NumPy makes borrowed arrays writeable; the memory is mapped read-only
    // and rewritten by the server once the batch is acknowledged.
    let arr = arr
        .try_readwrite()
        .map_err(|e| JoaderError::new_err(("internal", e.to_string())))?
        .make_nonwriteable();
    Ok(arr.as_any().clone())
}

#[allow(unsafe_code)]
fn shared_view<'py>(
    nd: &ArrayView<'_, u8, IxDyn>,
    keep: Bound<'py, PyAny>,
) -> Bound<'py, PyArrayDyn<u8>> {
    // SAFETY: `nd` borrows the read-only data mapping of a reader, and `keep`
    // (a `KeepAlive`, holding an `Arc` of that mapping) becomes the array's
    // base object, so the memory stays mapped as long as the array or any
    // view of it exists, even after the reader is closed. The caller clears
    // the array's WRITEABLE flag before any Python code can see it; what the
    // server writes there later (after the batch is acknowledged) changes the
    // bytes a stale view shows, which `Batch` documents, but never its memory
    // safety.
    unsafe { PyArray::borrow_from_array(nd, keep) }
}

type Aug = (u32, u32, f64, f64, f64, f64, f64);

fn to_aug(a: Aug) -> RandomResizedCrop {
    RandomResizedCrop {
        height: a.0,
        width: a.1,
        scale: (a.2, a.3),
        ratio: (a.4, a.5),
        flip: a.6,
    }
}

#[pymethods]
impl RingReader {
    /// Opens ring `ring` of server instance `instance`, waiting up to `open_timeout` seconds.
    #[new]
    #[pyo3(signature = (instance, ring, open_timeout = 5.0))]
    fn new(py: Python<'_>, instance: String, ring: String, open_timeout: f64) -> PyResult<Self> {
        let timeout = Duration::from_secs_f64(open_timeout.max(0.0));
        let raw = py
            .detach(|| RawReader::open(&instance, &ring, timeout))
            .map_err(err)?;
        let keep = Py::new(
            py,
            KeepAlive {
                _inner: raw.keep_alive(),
            },
        )?;
        Ok(RingReader {
            inner: Some(raw),
            batches: HashMap::new(),
            keep: Some(keep),
        })
    }

    /// Takes up to `max_items` records (see `joader.RingReader.next_batch`);
    /// `timeout` in seconds, `None` waits as long as the server lives.
    #[pyo3(signature = (max_items, timeout = None))]
    fn take<'py>(
        &mut self,
        py: Python<'py>,
        max_items: usize,
        timeout: Option<f64>,
    ) -> PyResult<Bound<'py, PyDict>> {
        let raw = self.inner.as_mut().ok_or_else(closed)?;
        let timeout = timeout.map(|t| Duration::from_secs_f64(t.max(0.0)));
        let b = py.detach(|| raw.take(max_items, timeout)).map_err(err)?;
        let d = PyDict::new(py);
        d.set_item("start", b.start)?;
        d.set_item("end", b.end)?;
        let ids: Vec<u32> = b.items.iter().map(|i| i.element_id).collect();
        let labels: Vec<i64> = b.items.iter().map(|i| i.label).collect();
        let epochs: Vec<u64> = b.items.iter().map(|i| i.epoch).collect();
        let positions: Vec<u64> = b.items.iter().map(|i| i.position).collect();
        let lengths: Vec<u64> = b.items.iter().map(|i| i.len).collect();
        let shapes = PyList::empty(py);
        for i in &b.items {
            match i.format {
                Format::HwcU8 {
                    height,
                    width,
                    channels,
                } => shapes.append((height, width, channels))?,
                Format::Raw => shapes.append(py.None())?,
            }
        }
        d.set_item("element_ids", ids)?;
        d.set_item("labels", labels)?;
        d.set_item("epochs", epochs)?;
        d.set_item("positions", positions)?;
        d.set_item("lengths", lengths)?;
        d.set_item("shapes", shapes)?;
        let errors: Vec<(u32, u32, &str, u64, u64)> = b
            .errors
            .iter()
            .map(|e| {
                (
                    e.element_id,
                    e.code,
                    dataplane::element_error::name(e.code),
                    e.epoch,
                    e.position,
                )
            })
            .collect();
        d.set_item("errors", errors)?;
        d.set_item("end_of_epoch", b.end_of_epoch.map(|e| (e.epoch, e.count)))?;
        d.set_item("end_of_stream", b.end_of_stream)?;
        if b.end > b.start {
            self.batches.insert(b.start, b);
        }
        Ok(d)
    }

    /// Acknowledges the batch that started at record `start`; its views must no longer be used.
    fn release(&mut self, start: u64) -> PyResult<()> {
        let raw = self.inner.as_mut().ok_or_else(closed)?;
        if self.batches.remove(&start).is_some() {
            raw.release(start);
        }
        Ok(())
    }

    /// Zero-copy read-only views of the batch at `start`'s items (see `joader.Batch.views`).
    fn views<'py>(&self, py: Python<'py>, start: u64) -> PyResult<Vec<Bound<'py, PyAny>>> {
        let raw = self.reader()?;
        let keep = self.keep.as_ref().ok_or_else(closed)?;
        self.batch(start)?
            .items
            .iter()
            .map(|i| view(py, raw, keep, i))
            .collect()
    }

    /// Copies (and optionally augments) the batch at `start` into `images`, a
    /// writeable C-contiguous uint8 array of shape `(B, H, W, C)`, and
    /// `labels`, a writeable C-contiguous int64 array of shape `(B,)`; returns
    /// the shape. Raises `ValueError` when an array does not fit.
    #[pyo3(signature = (start, images, labels, aug = None, seed = 0))]
    fn collate_into(
        &self,
        py: Python<'_>,
        start: u64,
        images: &Bound<'_, PyAny>,
        labels: &Bound<'_, PyAny>,
        aug: Option<Aug>,
        seed: u64,
    ) -> PyResult<(usize, usize, usize, usize)> {
        let raw = self.reader()?;
        let batch = self.batch(start)?;
        let aug = aug.map(to_aug);
        let shape = match &aug {
            Some(a) => dataplane::collate::augmented_shape(&batch.items, a),
            None => dataplane::collate::batch_shape(&batch.items),
        }
        .map_err(err)?;
        let mut images = out_array::<u8>(images, "images", &shape)?;
        let mut labels = out_array::<i64>(labels, "labels", &shape[..1])?;
        let images = images
            .as_slice_mut()
            .map_err(|e| PyValueError::new_err(format!("images: {e}")))?;
        let labels = labels
            .as_slice_mut()
            .map_err(|e| PyValueError::new_err(format!("labels: {e}")))?;
        // The GIL is released for the copy, as NumPy does for its own copies:
        // the arrays are borrowed (rust-numpy's borrow flags keep other Rust
        // code off them) and referenced by this call, so they stay allocated.
        py.detach(|| {
            let items: Vec<_> = batch.items.iter().map(|m| (*m, raw.bytes(m))).collect();
            match &aug {
                Some(a) => {
                    dataplane::collate::collate_augmented_into(&items, a, seed, images, labels)
                }
                None => dataplane::collate::collate_into(&items, images, labels),
            }
        })
        .map_err(err)?;
        Ok((shape[0], shape[1], shape[2], shape[3]))
    }

    /// Raises `JoaderError("server_gone")` if the server shut down or died.
    fn check_server(&self) -> PyResult<()> {
        self.reader()?.check_server().map_err(err)
    }

    /// The object that keeps the data mapping alive for NumPy views.
    fn keepalive(&self, py: Python<'_>) -> PyResult<Py<KeepAlive>> {
        self.keep
            .as_ref()
            .map(|k| k.clone_ref(py))
            .ok_or_else(closed)
    }

    /// Detaches from the ring (the server reclaims what we held). Views stay mapped.
    fn close(&mut self) {
        self.batches.clear();
        self.inner = None;
        self.keep = None;
    }

    /// Whether `close()` was called.
    #[getter]
    fn closed(&self) -> bool {
        self.inner.is_none()
    }

    /// Instance name.
    #[getter]
    fn instance(&self) -> PyResult<String> {
        Ok(self.reader()?.instance().to_string())
    }

    /// Ring name.
    #[getter]
    fn ring(&self) -> PyResult<String> {
        Ok(self.reader()?.ring().to_string())
    }

    /// Reader index (read bit) of this ring.
    #[getter]
    fn reader_index(&self) -> PyResult<u32> {
        Ok(self.reader()?.reader_index())
    }

    /// Ring capacity.
    #[getter]
    fn capacity(&self) -> PyResult<u32> {
        Ok(self.reader()?.capacity())
    }

    /// Pid of the server that owns the segment.
    #[getter]
    fn server_pid(&self) -> PyResult<u32> {
        Ok(self.reader()?.server_pid())
    }
}

/// A prefetched batch's buffer lent to Python: the base of the NumPy arrays over it, it
/// gives the buffer back to the prefetch pool when the last of them is collected (so a
/// buffer is rewritten only when no Python object refers to it any more).
#[pyclass(module = "joader._native", frozen)]
struct Lease {
    buf: Mutex<Option<BatchBuf>>,
    pool: Sender<BatchBuf>,
}

impl Drop for Lease {
    fn drop(&mut self) {
        let buf = self.buf.get_mut().map(|b| b.take()).unwrap_or(None);
        if let Some(b) = buf {
            // The prefetcher may be gone: the buffer is then freed here.
            let _ = self.pool.send(b);
        }
    }
}

#[allow(unsafe_code)]
fn leased_view<'py, T: Element>(
    nd: &ArrayView<'_, T, IxDyn>,
    lease: Bound<'py, PyAny>,
) -> Bound<'py, PyArrayDyn<T>> {
    // SAFETY: `nd` borrows the heap storage of a `Vec` owned by the `Lease` that becomes the
    // array's base object. The lease never touches or moves that storage while it exists
    // (it hands the Vec back to the pool only in its `Drop`, which runs once NumPy released
    // the last array over it), so the memory stays valid and unaliased by Rust for as long
    // as the array or any view of it (a torch tensor from `from_numpy` included) exists.
    unsafe { PyArray::borrow_from_array(nd, lease) }
}

/// Native prefetch of one ring (see `joader.Loader`): a thread reads, collates, augments and
/// acknowledges batches into pooled buffers while Python trains; `next` hands one over.
#[pyclass(module = "joader._native")]
struct Prefetcher {
    inner: Option<dataplane::prefetch::Prefetcher>,
    pool: Sender<BatchBuf>,
    float: bool,
}

#[pymethods]
impl Prefetcher {
    /// Opens ring `ring` of `instance` and starts the prefetch thread. `mean`/`std` (one per
    /// channel) select float32 NCHW output normalized as torchvision's `Normalize`; without
    /// them the output is uint8 NHWC.
    #[new]
    #[pyo3(signature = (instance, ring, batch_size, depth = 2, aug = None, seed = 0, mean = None, std = None, threads = None, pad_to = None, open_timeout = 10.0, first_pad_to = None))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        py: Python<'_>,
        instance: String,
        ring: String,
        batch_size: usize,
        depth: usize,
        aug: Option<Aug>,
        seed: u64,
        mean: Option<Vec<f32>>,
        std: Option<Vec<f32>>,
        threads: Option<usize>,
        pad_to: Option<u64>,
        open_timeout: f64,
        first_pad_to: Option<u64>,
    ) -> PyResult<Self> {
        let output = match (mean, std) {
            (None, None) => Output::U8Nhwc,
            (Some(mean), Some(std)) => Output::F32Nchw { mean, std },
            _ => return Err(PyValueError::new_err("give both mean and std, or neither")),
        };
        let float = output.is_float();
        let config = PrefetchConfig {
            batch_size,
            depth,
            aug: aug.map(to_aug),
            seed,
            output,
            threads: threads.unwrap_or_else(dataplane::collate::default_threads),
            pad_to,
            first_pad_to,
        };
        let timeout = Duration::from_secs_f64(open_timeout.max(0.0));
        let inner = py
            .detach(|| {
                let raw = RawReader::open(&instance, &ring, timeout)?;
                dataplane::prefetch::Prefetcher::start(raw, config)
            })
            .map_err(err)?;
        let pool = inner.recycler();
        Ok(Prefetcher {
            inner: Some(inner),
            pool,
            float,
        })
    }

    /// The next prepared batch as a dict (`images`: an array over a pooled buffer, None when
    /// the batch is empty; `labels`, `element_ids`, `epochs`, `positions`, `errors`,
    /// `end_of_epoch`, `end_of_stream`, `padded`), or None after the end of the stream.
    /// Waits with the GIL released, up to `timeout` seconds (`None`: as long as the server
    /// lives; then `JoaderError("timeout")`).
    #[pyo3(signature = (timeout = None))]
    fn next<'py>(
        &mut self,
        py: Python<'py>,
        timeout: Option<f64>,
    ) -> PyResult<Option<Bound<'py, PyDict>>> {
        let inner = self.inner.as_mut().ok_or_else(closed)?;
        let timeout = timeout.map(|t| Duration::from_secs_f64(t.max(0.0)));
        let Some(b) = py.detach(|| inner.next(timeout)).map_err(err)? else {
            return Ok(None);
        };
        let d = PyDict::new(py);
        let labels = PyArray::from_slice(py, &b.buf.labels[..b.len.min(b.buf.labels.len())]);
        d.set_item("labels", labels)?;
        d.set_item("element_ids", &b.element_ids)?;
        d.set_item("epochs", &b.epochs)?;
        d.set_item("positions", &b.positions)?;
        let errors: Vec<(u32, u32, &str, u64, u64)> = b
            .errors
            .iter()
            .map(|e| {
                (
                    e.element_id,
                    e.code,
                    dataplane::element_error::name(e.code),
                    e.epoch,
                    e.position,
                )
            })
            .collect();
        d.set_item("errors", errors)?;
        d.set_item("end_of_epoch", b.end_of_epoch.map(|e| (e.epoch, e.count)))?;
        d.set_item("end_of_stream", b.end_of_stream)?;
        d.set_item("padded", b.padded)?;
        if b.len == 0 {
            self.pool.send(b.buf).ok();
            d.set_item("images", py.None())?;
            return Ok(Some(d));
        }
        let n: usize = b.shape.iter().product();
        let float = self.float;
        let lease = Bound::new(
            py,
            Lease {
                buf: Mutex::new(Some(b.buf)),
                pool: self.pool.clone(),
            },
        )?;
        let images = {
            let guard = lease
                .get()
                .buf
                .lock()
                .map_err(|_| JoaderError::new_err(("internal", "lease lock poisoned")))?;
            let Some(buf) = guard.as_ref() else {
                return Err(JoaderError::new_err(("internal", "lease without buffer")));
            };
            let shape = IxDyn(&b.shape);
            let bad =
                |e: numpy::ndarray::ShapeError| JoaderError::new_err(("collate", e.to_string()));
            if float {
                let nd = ArrayView::from_shape(shape, &buf.f32s[..n]).map_err(bad)?;
                leased_view(&nd, lease.clone().into_any()).into_any()
            } else {
                let nd = ArrayView::from_shape(shape, &buf.u8s[..n]).map_err(bad)?;
                leased_view(&nd, lease.clone().into_any()).into_any()
            }
        };
        d.set_item("images", images)?;
        Ok(Some(d))
    }

    /// Batch buffers allocated so far: stays at the prefetch depth plus the batches the
    /// consumer holds.
    #[getter]
    fn buffers_allocated(&self) -> PyResult<usize> {
        Ok(self.inner.as_ref().ok_or_else(closed)?.buffers_allocated())
    }

    /// Stops the thread and detaches from the ring; arrays already handed out stay valid.
    fn close(&mut self, py: Python<'_>) {
        if let Some(p) = self.inner.take() {
            py.detach(move || drop(p));
        }
    }
}

/// Stable name of an element error code.
#[pyfunction]
fn element_error_name(code: u32) -> &'static str {
    dataplane::element_error::name(code)
}

/// Augments one HWC u8 image (bytes) with the crop/flip parameters and key; returns the output bytes.
#[pyfunction]
#[pyo3(signature = (image, height, width, channels, aug, seed, epoch, position))]
#[allow(clippy::too_many_arguments)]
fn augment_image(
    py: Python<'_>,
    image: &[u8],
    height: u32,
    width: u32,
    channels: u32,
    aug: Aug,
    seed: u64,
    epoch: u64,
    position: u64,
) -> PyResult<Vec<u8>> {
    let a = to_aug(aug);
    a.validate().map_err(err)?;
    if image.len() != (height * width * channels) as usize {
        return Err(JoaderError::new_err((
            "collate",
            "image length does not match its shape",
        )));
    }
    let mut out = vec![0u8; (a.height * a.width * channels) as usize];
    let key = dataplane::augment::item_key(seed, epoch, position);
    py.detach(|| a.apply(image, height, width, channels, &mut out, key))
        .map_err(err)?;
    Ok(out)
}

/// Native part of the `joader` package.
/// A set of element ids (a roaring bitmap): what a `Loader` has handed over of the current
/// epoch, kept compact (any part of ImageNet's 1.28 M ids takes at most ~160 KiB, 214 KiB in
/// base64) and serialized in the portable roaring format that `resume.consumed` of
/// `POST /v1/jobs` carries.
#[pyclass(module = "joader._native")]
#[derive(Default)]
struct IdSet(roaring::RoaringBitmap);

#[pymethods]
impl IdSet {
    #[new]
    fn new() -> Self {
        Self::default()
    }

    /// The set serialized by `to_bytes`.
    #[staticmethod]
    fn from_bytes(data: &[u8]) -> PyResult<Self> {
        roaring::RoaringBitmap::deserialize_from(data)
            .map(IdSet)
            .map_err(|e| PyValueError::new_err(format!("not a serialized roaring bitmap: {e}")))
    }

    /// Adds ids (any iterable of non-negative integers below 2^32).
    fn add(&mut self, ids: Vec<u32>) {
        self.0.extend(ids);
    }

    /// Adds every id of `other`.
    fn update(&mut self, other: &IdSet) {
        self.0 |= &other.0;
    }

    fn clear(&mut self) {
        self.0.clear();
    }

    fn to_bytes<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, pyo3::types::PyBytes>> {
        let mut out = Vec::with_capacity(self.0.serialized_size());
        self.0
            .serialize_into(&mut out)
            .map_err(|e| PyValueError::new_err(e.to_string()))?;
        Ok(pyo3::types::PyBytes::new(py, &out))
    }

    fn to_list(&self) -> Vec<u32> {
        self.0.iter().collect()
    }

    fn __len__(&self) -> usize {
        self.0.len() as usize
    }

    fn __contains__(&self, id: i64) -> bool {
        u32::try_from(id).is_ok_and(|i| self.0.contains(i))
    }
}

#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<RingReader>()?;
    m.add_class::<KeepAlive>()?;
    m.add_class::<Prefetcher>()?;
    m.add_class::<Lease>()?;
    m.add_class::<IdSet>()?;
    m.add("JoaderError", m.py().get_type::<JoaderError>())?;
    m.add("LAYOUT_VERSION", dataplane::LAYOUT_VERSION)?;
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    m.add_function(wrap_pyfunction!(element_error_name, m)?)?;
    m.add_function(wrap_pyfunction!(augment_image, m)?)?;
    Ok(())
}
