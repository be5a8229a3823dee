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

/// Resizes (if `resize_shorter`) then center-crops (if `center_crop`, `[height, width]`).
///
/// Sizes and the crop are those of the stored image (`img.stored`): a DCT-scaled decode gives
/// the same geometry as a full one, its crop box being the stored one times `eighths / 8`.
pub(super) fn resize_crop(
    img: Rgb,
    resize_shorter: Option<u32>,
    center_crop: Option<[u32; 2]>,
    limits: &Limits,
) -> Result<Rgb, PipelineError> {
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
    if (rw, rh) == (img.width, img.height) && img.eighths == 8 {
        if (cw, ch) == (rw, rh) {
            return Ok(img);
        }
        return Ok(crop_copy(&img, cw, ch));
    }

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
    let mut dst = Image::new(cw, ch, PixelType::U8x3);
    Resizer::new()
        .resize(&src, &mut dst, &options)
        .map_err(|e| PipelineError::Corrupt(format!("resize: {e}").to_lowercase()))?;
    Ok(Rgb {
        data: dst.into_vec(),
        width: cw,
        height: ch,
        eighths: 8,
        stored: (cw, ch),
    })
}

/// Cuts the centered `cw`×`ch` window out of an image that needs no resize.
fn crop_copy(img: &Rgb, cw: u32, ch: u32) -> Rgb {
    let (x0, y0) = ((img.width - cw) / 2, (img.height - ch) / 2);
    let stride = img.width as usize * 3;
    let mut data = Vec::with_capacity(cw as usize * ch as usize * 3);
    for y in y0..y0 + ch {
        let start = y as usize * stride + x0 as usize * 3;
        data.extend_from_slice(&img.data[start..start + cw as usize * 3]);
    }
    Rgb {
        data,
        width: cw,
        height: ch,
        eighths: 8,
        stored: (cw, ch),
    }
}
