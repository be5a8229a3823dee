//! `joader._native`: the Rust half of the `joader` Python package.
//!
//! Thin bindings over `dataplane::RawReader`: waiting releases the GIL, and
//! batches are described by plain Python values (ids, labels, lengths,
//! shapes). NumPy arrays cross the boundary through rust-numpy only: views of
//! shared memory are made here (read-only, with the mapping as their base),
//! and collation writes into arrays whose dtype, shape, contiguity and
//! writability are checked here, so no raw address ever comes from Python.
//!
//! This file defines the module; each class and its helpers has its own file:
//! `reader` (`RingReader`), `prefetch` (`Prefetcher`, `Lease`), `batch` (the
//! batch dictionaries), `arrays` (NumPy views and checked output arrays,
//! `KeepAlive`), `augment` (augmentation parameters, `augment_image`, `draw_crop`), `idset`
//! (`IdSet`) and `error` (`JoaderError`).
#![deny(unsafe_code)]
// Functions read as their steps: none over the threshold of the folder's `clippy.toml`.
#![warn(clippy::too_many_lines)]

use pyo3::prelude::*;

/// mimalloc for the extension's own allocations (Python's stay with Python's allocator). Each
/// random resized crop has fast_image_resize build its coefficient tables anew: a few
/// allocations of some KiB per image, on augmentation threads that start and end with each
/// batch, and glibc's malloc spends 5-10% of the crop on them. mimalloc took the training loop's
/// CPU per image to 0.93x (`server/tools/regress/regress.py`, 15 alternating rounds).
/// Version 2 (the workspace's daemon uses 3): version 3 takes locks on its heap lists where a
/// thread starts and ends, and registers no `pthread_atfork` handler, so a training process that
/// forked (a DataLoader's workers, `multiprocessing`) while an augmentation thread held one would
/// leave its child a lock no thread releases; version 2's allocation, free, thread start and exit
/// take none (its locks guard OS-allocated segments, explicit collection, statistics output and
/// process start).
/// `local_dynamic_tls`: this library is loaded by `dlopen`, where initial-exec thread-locals may
/// not fit glibc's static TLS reserve.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

mod arrays;
mod augment;
mod batch;
mod error;
mod idset;
mod prefetch;
mod reader;

#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<reader::RingReader>()?;
    m.add_class::<arrays::KeepAlive>()?;
    m.add_class::<prefetch::Prefetcher>()?;
    m.add_class::<prefetch::Lease>()?;
    m.add_class::<idset::IdSet>()?;
    m.add("JoaderError", m.py().get_type::<error::JoaderError>())?;
    m.add("LAYOUT_VERSION", dataplane::LAYOUT_VERSION)?;
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    m.add_function(wrap_pyfunction!(error::element_error_name, m)?)?;
    m.add_function(wrap_pyfunction!(augment::augment_image, m)?)?;
    m.add_function(wrap_pyfunction!(augment::draw_crop, m)?)?;
    Ok(())
}
