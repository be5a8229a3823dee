//! Errors crossing into Python: the `JoaderError` exception (its `args` are a stable code and
//! a message, the codes the server's API and the clients share), the conversion of the data
//! plane's `Error` into it, and the names of element error codes.

use pyo3::exceptions::PyException;
use pyo3::prelude::*;

pyo3::create_exception!(
    _native,
    JoaderError,
    PyException,
    "Error of the joader data plane or server; `args` is `(code, message)`."
);

/// The data plane's error as a `JoaderError` carrying its stable code.
pub(crate) fn err(e: dataplane::Error) -> PyErr {
    JoaderError::new_err((e.code(), e.to_string()))
}

/// `JoaderError("reader_closed")`: a method was called after `close()`.
pub(crate) fn closed() -> PyErr {
    JoaderError::new_err(("reader_closed", "the reader is closed"))
}

/// Stable name of an element error code.
#[pyfunction]
pub(crate) fn element_error_name(code: u32) -> &'static str {
    dataplane::element_error::name(code)
}
