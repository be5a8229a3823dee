//! NumPy arrays across the boundary, through rust-numpy only: read-only zero-copy views of a
//! reader's shared data mapping (with a `KeepAlive` of the mapping as their base), and the
//! checks that an array Python hands in for collation has the dtype, shape, contiguity and
//! writability the copy needs, so that no raw address ever comes from Python.

use dataplane::{DataKeepAlive, Format, ItemMeta, RawReader};
use numpy::ndarray::{ArrayView, IxDyn};
use numpy::{
    Element, PyArray, PyArrayDescrMethods, PyArrayDyn, PyArrayMethods, PyReadwriteArrayDyn,
    PyUntypedArray, PyUntypedArrayMethods,
};
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;

use crate::error::JoaderError;

/// Keeps the read-only data mapping alive while NumPy views of it exist.
#[pyclass(module = "joader._native", frozen)]
pub(crate) struct KeepAlive {
    _inner: DataKeepAlive,
}

impl KeepAlive {
    /// A keep-alive of `raw`'s data mapping, valid after `raw` is closed.
    pub(crate) fn of(raw: &RawReader) -> Self {
        KeepAlive {
            _inner: raw.keep_alive(),
        }
    }
}

/// Borrows `a` for writing after checking that it is a NumPy array of
/// element type `T`, of exactly `shape`, C-contiguous and writeable; any
/// mismatch is a `ValueError` naming `what`, what was expected and what came.
pub(crate) fn out_array<'py, T: Element>(
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
pub(crate) fn view<'py>(
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
