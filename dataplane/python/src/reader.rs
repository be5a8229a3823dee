//! `RingReader`: the low-level reader of one delivery ring behind `joader.RingReader`. It
//! holds the batches taken and not yet acknowledged, so that their items can be viewed
//! (zero-copy, read-only) or collated (optionally augmented) into arrays Python owns; waiting
//! and copying release the GIL.

use std::collections::HashMap;
use std::time::Duration;

use dataplane::{RawBatch, RawReader};
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::PyDict;

use crate::arrays::{KeepAlive, out_array, view};
use crate::augment::{Aug, to_aug};
use crate::batch::raw_batch_dict;
use crate::error::{JoaderError, closed, err};

/// Low-level reader of one delivery ring (see `joader.RingReader`).
#[pyclass(module = "joader._native")]
pub(crate) struct RingReader {
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
        let keep = Py::new(py, KeepAlive::of(&raw))?;
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
        let d = raw_batch_dict(py, &b)?;
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
