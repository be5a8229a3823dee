//! `Prefetcher`: the native prefetch behind `joader.Loader`. A data plane thread reads,
//! collates, augments and acknowledges batches into pooled buffers while Python trains; each
//! batch handed over lends its buffer to Python through a `Lease`, the base of the NumPy
//! arrays over it, which returns the buffer to the pool once the last of them is collected.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use dataplane::RawReader;
use dataplane::augment::Output;
use dataplane::prefetch::{BatchBuf, PrefetchConfig, Sender};
use dataplane::stages::StageSink;
use numpy::ndarray::{ArrayView, IxDyn};
use numpy::{Element, PyArray, PyArrayDyn, PyArrayMethods};
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::PyDict;

use crate::augment::{Aug, to_aug};
use crate::batch::set_stream_fields;
use crate::error::{JoaderError, closed, err};

/// One field's kind, flags and value per item of a batch (`None`: the item lacks it).
type FieldColumn<'a> = (dataplane::fields::FieldKind, u8, Vec<Option<&'a [u8]>>);

/// The small fields of a batch's items (their blocks, `dataplane::fields`), by name:
/// `{name: (kind, fixed_shape, [value bytes per item, None where the item lacks it])}` in the
/// items' order, or None when no item has any. An item lacks a field only when the dataset
/// declares it optional; two items that give one name two kinds make a corrupt block.
fn fields_dict<'py>(py: Python<'py>, blocks: &[Vec<u8>]) -> PyResult<Option<Bound<'py, PyDict>>> {
    if blocks.iter().all(Vec::is_empty) {
        return Ok(None);
    }
    let parsed = blocks
        .iter()
        .map(|b| dataplane::fields::parse(b))
        .collect::<Result<Vec<_>, _>>()
        .map_err(err)?;
    let mut by_name: std::collections::BTreeMap<&str, FieldColumn<'_>> =
        std::collections::BTreeMap::new();
    for (i, item) in parsed.iter().enumerate() {
        for f in item {
            let entry = by_name
                .entry(f.name)
                .or_insert_with(|| (f.kind, f.flags, vec![None; parsed.len()]));
            if entry.0 != f.kind || entry.2[i].is_some() {
                return Err(JoaderError::new_err((
                    "segment_corrupt",
                    format!("the items of a batch disagree on their field `{}`", f.name),
                )));
            }
            entry.2[i] = Some(f.value);
        }
    }
    let d = PyDict::new(py);
    for (name, (kind, flags, values)) in by_name {
        let fixed = flags & dataplane::fields::FIXED_SHAPE != 0;
        if fixed
            && kind == dataplane::fields::FieldKind::Npy
            && let Some((first, data)) = stacked_npy(&values)
        {
            // The data move into the array (no copy).
            let stacked = (
                pyo3::types::PyBytes::new(py, first),
                PyArray::from_vec(py, data),
                values.len(),
            );
            d.set_item(name, (kind.name(), fixed, stacked))?;
            continue;
        }
        let values: Vec<Option<Bound<'py, pyo3::types::PyBytes>>> = values
            .into_iter()
            .map(|v| v.map(|v| pyo3::types::PyBytes::new(py, v)))
            .collect();
        d.set_item(name, (kind.name(), fixed, values))?;
    }
    Ok(Some(d))
}

/// The `.npy` values of a fixed-shape field stacked: the first value whole (its header gives
/// the dtype and shape of every item) and every value's data end to end (handed to Python as
/// a uint8 array that owns them), when every item has the field, with one header (byte for
/// byte) in C order. `None` otherwise: the values then go to Python one by one. One copy of
/// each value instead of three (a `bytes` object, its `np.load`, `np.stack`).
fn stacked_npy<'a>(values: &[Option<&'a [u8]>]) -> Option<(&'a [u8], Vec<u8>)> {
    let first = (*values.first()?)?;
    let header = npy_header_len(first)?;
    let head = &first[..header];
    if std::str::from_utf8(head).is_ok_and(|h| h.contains("True")) {
        return None; // Fortran order: its data are not rows of the stacked array.
    }
    let mut data = Vec::with_capacity((first.len() - header) * values.len());
    for v in values {
        let v = (*v)?;
        if v.len() != first.len() || &v[..header] != head {
            return None;
        }
        data.extend_from_slice(&v[header..]);
    }
    Some((first, data))
}

/// The length of an `.npy` value's header (magic, version, length and dict), if well formed.
fn npy_header_len(v: &[u8]) -> Option<usize> {
    if v.len() < 10 || &v[..6] != b"\x93NUMPY" {
        return None;
    }
    let len = match v[6] {
        1 => 10 + usize::from(u16::from_le_bytes([v[8], v[9]])),
        2 | 3 if v.len() >= 12 => 12 + u32::from_le_bytes([v[8], v[9], v[10], v[11]]) as usize,
        _ => return None,
    };
    (len <= v.len()).then_some(len)
}

/// A prefetched batch's buffer lent to Python: the base of the NumPy arrays over it, it
/// gives the buffer back to the prefetch pool when the last of them is collected (so a
/// buffer is rewritten only when no Python object refers to it any more).
#[pyclass(module = "joader._native", frozen)]
pub(crate) struct Lease {
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
pub(crate) struct Prefetcher {
    inner: Option<dataplane::prefetch::Prefetcher>,
    pool: Sender<BatchBuf>,
    float: bool,
    /// Its threads' CPU time by stage (kept after `close`).
    stages: Arc<StageSink>,
}

#[pymethods]
impl Prefetcher {
    /// Opens ring `ring` of `instance` and starts the prefetch thread. `mean`/`std` (one per
    /// channel) select float32 NCHW output normalized as torchvision's `Normalize`; without
    /// them the output is uint8 NHWC. `padded` (without `mean`/`std`) selects the padded uint8
    /// batch of the cached images, not cropped, with each item's crop and flip drawn.
    #[new]
    #[pyo3(signature = (instance, ring, batch_size, depth = 2, aug = None, seed = 0, mean = None, std = None, threads = None, pad_to = None, open_timeout = 10.0, first_pad_to = None, padded = false))]
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
        padded: bool,
    ) -> PyResult<Self> {
        let output = match (mean, std) {
            (None, None) if padded => Output::U8Padded,
            _ if padded => {
                return Err(PyValueError::new_err(
                    "a padded batch is uint8: normalize after the crop, not here",
                ));
            }
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
        let stages = inner.stage_sink();
        Ok(Prefetcher {
            inner: Some(inner),
            pool,
            float,
            stages,
        })
    }

    /// The next prepared batch as a dict (`images`: an array over a pooled buffer, None when
    /// the batch is empty; `labels`, `element_ids`, `epochs`, `positions`, `errors`,
    /// `end_of_epoch`, `end_of_stream`, `padded`; for a padded batch `sizes` (B, 2) and `boxes`
    /// (B, 4: top, left, height, width) int64 and `flips` (B,) bool; when the batch carries
    /// small fields, `cached_sizes` and `source_sizes` (B, 2) int64: each image's height and
    /// width as cached and before the server's pipeline, 0 when not known), or None after the
    /// end of the stream.
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
        set_stream_fields(&d, &b.errors, b.end_of_epoch, b.end_of_stream)?;
        d.set_item("padded", b.padded)?;
        d.set_item("fields", fields_dict(py, &b.fields)?)?;
        if b.fields.iter().any(|f| !f.is_empty()) {
            let n = b.geometry.len();
            let (mut cached, mut source) = (Vec::with_capacity(2 * n), Vec::with_capacity(2 * n));
            for g in &b.geometry {
                cached.extend([g.cached.0, g.cached.1].map(i64::from));
                source.extend([g.source.0, g.source.1].map(i64::from));
            }
            d.set_item(
                "cached_sizes",
                PyArray::from_vec(py, cached).reshape([n, 2])?,
            )?;
            d.set_item(
                "source_sizes",
                PyArray::from_vec(py, source).reshape([n, 2])?,
            )?;
        }
        if !b.crops.is_empty() {
            let n = b.crops.len();
            let (mut sizes, mut boxes) = (Vec::with_capacity(2 * n), Vec::with_capacity(4 * n));
            for c in &b.crops {
                let (t, l, h, w) = c.window;
                sizes.extend([c.image.0, c.image.1].map(i64::from));
                boxes.extend([t, l, h, w].map(i64::from));
            }
            let flips: Vec<bool> = b.crops.iter().map(|c| c.flip).collect();
            d.set_item("sizes", PyArray::from_vec(py, sizes).reshape([n, 2])?)?;
            d.set_item("boxes", PyArray::from_vec(py, boxes).reshape([n, 4])?)?;
            d.set_item("flips", PyArray::from_slice(py, &flips))?;
        }
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

    /// Seconds of thread CPU per stage of the prefetch (`wait`, `copy`, `crop_resize`, `flip`,
    /// `normalize`, `collate`, `handover`) since it started, over its prefetch thread and its
    /// augmentation threads; still readable after `close`.
    fn stage_cpu<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let d = PyDict::new(py);
        for (name, seconds) in self.stages.seconds() {
            d.set_item(name, seconds)?;
        }
        Ok(d)
    }

    /// Stops the thread and detaches from the ring; arrays already handed out stay valid.
    fn close(&mut self, py: Python<'_>) {
        if let Some(p) = self.inner.take() {
            py.detach(move || drop(p));
        }
    }
}
