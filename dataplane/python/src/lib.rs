//! `joader._native`: the Rust half of the `joader` Python package.
//!
//! Thin bindings over `dataplane::RawReader`: waiting releases the GIL, and
//! batches are described by plain Python values (addresses, lengths,
//! shapes) from which the pure-Python layer builds NumPy views. Collation
//! writes into a NumPy array the Python layer allocated and validated.
#![deny(unsafe_code)]

use std::collections::HashMap;
use std::time::Duration;

use dataplane::augment::RandomResizedCrop;
use dataplane::{DataKeepAlive, Format, RawBatch, RawReader};
use pyo3::exceptions::PyException;
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
        let addresses: Vec<usize> = b.items.iter().map(|i| raw.address(i)).collect();
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
        d.set_item("addresses", addresses)?;
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

    /// Copies (and optionally augments) the batch at `start` into the memory
    /// at `images_addr` / `labels_addr`, which the caller guarantees to be
    /// live, writable, C-contiguous buffers of the given byte/element lengths.
    #[pyo3(signature = (start, images_addr, images_len, labels_addr, labels_len, aug = None, seed = 0))]
    #[allow(clippy::too_many_arguments)]
    fn collate_into(
        &self,
        py: Python<'_>,
        start: u64,
        images_addr: usize,
        images_len: usize,
        labels_addr: usize,
        labels_len: usize,
        aug: Option<Aug>,
        seed: u64,
    ) -> PyResult<(usize, usize, usize, usize)> {
        let raw = self.reader()?;
        let batch = self.batches.get(&start).ok_or_else(|| {
            JoaderError::new_err(("batch_released", "the batch was already acknowledged"))
        })?;
        let shape = py
            .detach(|| {
                let items: Vec<_> = batch.items.iter().map(|m| (*m, raw.bytes(m))).collect();
                let (images, labels) = out_slices(images_addr, images_len, labels_addr, labels_len);
                match aug {
                    Some(a) => dataplane::collate::collate_augmented_into(
                        &items,
                        &to_aug(a),
                        seed,
                        images,
                        labels,
                    ),
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

#[allow(unsafe_code)]
fn out_slices<'a>(
    images_addr: usize,
    images_len: usize,
    labels_addr: usize,
    labels_len: usize,
) -> (&'a mut [u8], &'a mut [i64]) {
    // SAFETY: the Python layer (`joader._collate`) passes the data pointers
    // of two live NumPy arrays it owns for the duration of this call (they
    // are arguments of the calling frame, so they cannot be freed or
    // resized), after checking they are writable, C-contiguous, of dtype
    // uint8 / int64 and of these lengths; they do not overlap each other or
    // the read-only shared mapping we read from.
    unsafe {
        (
            std::slice::from_raw_parts_mut(images_addr as *mut u8, images_len),
            std::slice::from_raw_parts_mut(labels_addr as *mut i64, labels_len),
        )
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
    py.detach(|| a.apply(image, height, width, channels, &mut out, key));
    Ok(out)
}

/// Native part of the `joader` package.
#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<RingReader>()?;
    m.add_class::<KeepAlive>()?;
    m.add("JoaderError", m.py().get_type::<JoaderError>())?;
    m.add("LAYOUT_VERSION", dataplane::LAYOUT_VERSION)?;
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    m.add_function(wrap_pyfunction!(element_error_name, m)?)?;
    m.add_function(wrap_pyfunction!(augment_image, m)?)?;
    Ok(())
}
