//! Resize of the shorter side and center crop, fused into one fast_image_resize call.

use fast_image_resize::images::{Image, ImageRef};
use fast_image_resize::{FilterType, PixelType, ResizeAlg, ResizeOptions, Resizer};

use super::decode::Rgb;
use super::{Limits, PipelineError};

/// Size of the image after resizing its shorter side to `target` (the other side rounded to
/// the nearest integer, at least 1).
pub(super) fn resized_size(width: u32, height: u32, target: u32) -> (u32, u32) {
    let scale_other = |long: u32, short: u32| -> u32 {
        let v = (f64::from(long) * f64::from(target) / f64::from(short)).round();
        (v as u32).max(1)
    };
    if width <= height {
        (target, scale_other(height, width))
    } else {
        (scale_other(width, height), target)
    }
}

/// The output of a resize and crop of one decoded image: its size, checked against the
/// limits, before any pixel is computed (so that the caller can give the output a place).
#[derive(Debug, Clone, Copy)]
pub(super) struct Plan {
    /// Size after the resize of the shorter side.
    rw: u32,
    rh: u32,
    /// Size of the output (after the crop).
    pub(super) cw: u32,
    pub(super) ch: u32,
}

impl Plan {
    /// Bytes of the output (RGB8).
    pub(super) fn len(&self) -> usize {
        self.cw as usize * self.ch as usize * 3
    }

    /// The decoded image is the output as it is.
    pub(super) fn is_identity(&self, img: &Rgb) -> bool {
        (self.rw, self.rh) == (img.width, img.height)
            && img.eighths == 8
            && (self.cw, self.ch) == (self.rw, self.rh)
    }
}

/// The resize (if `resize_shorter`) and center crop (if `center_crop`, `[height, width]`) of
/// `img`, checked: the crop must fit and the output must be within the pixel limit.
pub(super) fn plan(
    img: &Rgb,
    resize_shorter: Option<u32>,
    center_crop: Option<[u32; 2]>,
    limits: &Limits,
) -> Result<Plan, PipelineError> {
    let (sw, sh) = img.stored;
    let (rw, rh) = match resize_shorter {
        Some(t) => resized_size(sw, sh, t),
        None => (sw, sh),
    };
    let (cw, ch) = match center_crop {
        Some([h, w]) => (w, h),
        None => (rw, rh),
    };
    if cw > rw || ch > rh {
        return Err(PipelineError::CropTooLarge {
            crop_height: ch,
            crop_width: cw,
            height: rh,
            width: rw,
        });
    }
    if u64::from(cw) * u64::from(ch) > limits.max_pixels {
        return Err(PipelineError::TooLarge {
            width: u64::from(cw),
            height: u64::from(ch),
            max_pixels: limits.max_pixels,
        });
    }
    Ok(Plan { rw, rh, cw, ch })
}

/// Writes the output of `plan` for `img` into `dst` (exactly [`Plan::len`] bytes).
///
/// Sizes and the crop are those of the stored image (`img.stored`): a DCT-scaled decode gives
/// the same geometry as a full one, its crop box being the stored one times `eighths / 8`.
pub(super) fn apply_into(img: &Rgb, p: &Plan, dst: &mut [u8]) -> Result<(), PipelineError> {
    if dst.len() != p.len() {
        return Err(PipelineError::Corrupt(format!(
            "resize: an output of {} bytes for {}x{} pixels",
            dst.len(),
            p.cw,
            p.ch
        )));
    }
    if p.is_identity(img) {
        dst.copy_from_slice(&img.data);
        return Ok(());
    }
    let (rw, rh, cw, ch) = (p.rw, p.rh, p.cw, p.ch);
    if (rw, rh) == (img.width, img.height) && img.eighths == 8 {
        crop_copy_into(img, cw, ch, dst);
        return Ok(());
    }
    let (sw, sh) = img.stored;

    // The crop, in resized pixels, at an integer offset; mapped back into source coordinates
    // (fractional) so that only the kept pixels are computed. A decoded side is
    // ⌈stored × eighths / 8⌉, so the stored image spans `stored × eighths / 8` decoded pixels
    // from the left edge; a box that ends there may overshoot it by a rounding error, which the
    // resizer would refuse, hence the clamp.
    let (off_x, off_y) = ((rw - cw) / 2, (rh - ch) / 2);
    let eighths = f64::from(img.eighths) / 8.0;
    let sx = f64::from(sw) * eighths / f64::from(rw);
    let sy = f64::from(sh) * eighths / f64::from(rh);
    let (left, top) = (f64::from(off_x) * sx, f64::from(off_y) * sy);
    let options = ResizeOptions::new()
        .resize_alg(ResizeAlg::Convolution(FilterType::Bilinear))
        .crop(
            left,
            top,
            (f64::from(cw) * sx).min(f64::from(img.width) - left),
            (f64::from(ch) * sy).min(f64::from(img.height) - top),
        );
    let src = ImageRef::new(img.width, img.height, &img.data, PixelType::U8x3)
        .map_err(|e| PipelineError::Corrupt(format!("resize: {e}").to_lowercase()))?;
    let mut out = Image::from_slice_u8(cw, ch, dst, PixelType::U8x3)
        .map_err(|e| PipelineError::Corrupt(format!("resize: {e}").to_lowercase()))?;
    Resizer::new()
        .resize(&src, &mut out, &options)
        .map_err(|e| PipelineError::Corrupt(format!("resize: {e}").to_lowercase()))
}

/// Cuts the centered `cw`×`ch` window out of an image that needs no resize into `dst`.
fn crop_copy_into(img: &Rgb, cw: u32, ch: u32, dst: &mut [u8]) {
    let (x0, y0) = ((img.width - cw) / 2, (img.height - ch) / 2);
    let stride = img.width as usize * 3;
    let row = cw as usize * 3;
    for (y, out) in (y0..y0 + ch).zip(dst.chunks_exact_mut(row)) {
        let start = y as usize * stride + x0 as usize * 3;
        out.copy_from_slice(&img.data[start..start + row]);
    }
}
