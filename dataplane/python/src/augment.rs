//! Augmentation parameters from Python: the `(height, width, scale_lo, scale_hi, ratio_lo,
//! ratio_hi, flip, whole)` tuple that `collate_into` and `Prefetcher` take (built by
//! `joader.RandomResizedCrop`), and `augment_image`, which applies it to one image exactly as
//! a batch item would be augmented (`RandomResizedCrop.apply`), and `draw_crop`, the crop
//! window and flip it draws (`RandomResizedCrop.draw`).

use dataplane::augment::RandomResizedCrop;
use pyo3::prelude::*;

use crate::error::{JoaderError, err};

/// A `RandomResizedCrop` (or `Resize`: `whole`) as Python passes it: height, width, scale
/// range, ratio range, flip probability, whether the whole image is taken.
pub(crate) type Aug = (u32, u32, f64, f64, f64, f64, f64, bool);

/// The crop/flip parameters `a` describes.
pub(crate) fn to_aug(a: Aug) -> RandomResizedCrop {
    RandomResizedCrop {
        height: a.0,
        width: a.1,
        scale: (a.2, a.3),
        ratio: (a.4, a.5),
        flip: a.6,
        whole: a.7,
    }
}

/// Augments one HWC u8 image (bytes) with the crop/flip parameters and key; returns the output bytes.
#[pyfunction]
#[pyo3(signature = (image, height, width, channels, aug, seed, epoch, position))]
#[allow(clippy::too_many_arguments)]
pub(crate) fn augment_image(
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

/// The crop window `(top, left, height, width)` and flip that `aug` draws for an item of
/// `height × width` at `(epoch, position)` of a job with `seed`: those `augment_image` and a
/// padded batch's `boxes`/`flips` use.
#[pyfunction]
#[pyo3(signature = (height, width, aug, seed, epoch, position))]
pub(crate) fn draw_crop(
    height: u32,
    width: u32,
    aug: Aug,
    seed: u64,
    epoch: u64,
    position: u64,
) -> PyResult<(u32, u32, u32, u32, bool)> {
    let a = to_aug(aug);
    a.validate().map_err(err)?;
    if height == 0 || width == 0 {
        return Err(JoaderError::new_err((
            "collate",
            "an image has at least one pixel",
        )));
    }
    let key = dataplane::augment::item_key(seed, epoch, position);
    let c = a.draw(height, width, key);
    let (t, l, h, w) = c.window;
    Ok((t, l, h, w, c.flip))
}
