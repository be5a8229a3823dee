//! The batch dictionaries handed to Python: `RingReader.take`'s description of a raw batch
//! (plain Python values: ids, labels, lengths, shapes), and the errors and end-of-epoch/stream
//! fields that it shares with `Prefetcher.next`'s prepared batches.

use dataplane::{ElementError, EpochEnd, Format, RawBatch};
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList};

/// `RingReader.take`'s dictionary of `b`: its record range, per-item lists and the stream fields.
pub(crate) fn raw_batch_dict<'py>(py: Python<'py>, b: &RawBatch) -> PyResult<Bound<'py, PyDict>> {
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
    set_stream_fields(&d, &b.errors, b.end_of_epoch, b.end_of_stream)?;
    Ok(d)
}

/// Sets, in this order, `errors` (a list of `(element_id, code, code name, epoch, position)`),
/// `end_of_epoch` (`(epoch, count)` or None) and `end_of_stream`: the fields every batch
/// dictionary carries, whether read raw or prefetched.
pub(crate) fn set_stream_fields(
    d: &Bound<'_, PyDict>,
    errors: &[ElementError],
    end_of_epoch: Option<EpochEnd>,
    end_of_stream: bool,
) -> PyResult<()> {
    let errors: Vec<(u32, u32, &str, u64, u64)> = errors
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
    d.set_item("end_of_epoch", end_of_epoch.map(|e| (e.epoch, e.count)))?;
    d.set_item("end_of_stream", end_of_stream)?;
    Ok(())
}
