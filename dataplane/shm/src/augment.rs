//! Per-job augmentation applied by the client after the shared cache:
//! random resized crop (torchvision's `RandomResizedCrop` parameters: ten tries,
//! then the central fallback) resized by `fast_image_resize` (SIMD, antialiased
//! bilinear convolution), an optional horizontal flip, and the output layouts
//! (uint8 NHWC, or float32 NCHW normalized by mean/std) written once into the
//! batch buffer.
//!
//! The randomness of an item depends only on the job's seed, the epoch and
//! the item's position in the epoch ([`item_key`]), never on batch
//! boundaries or thread scheduling, so a job with a fixed seed augments
//! reproducibly whenever its order is reproducible.

use fast_image_resize::images::{Image, ImageRef};
use fast_image_resize::{FilterType, PixelType, ResizeAlg, ResizeOptions, Resizer};

use crate::error::{Error, Result};

/// Random resized crop to `height × width`, then horizontal flip with probability `flip`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RandomResizedCrop {
    /// Output rows.
    pub height: u32,
    /// Output columns.
    pub width: u32,
    /// Range of the crop area as a fraction of the image area (default 0.08..1.0).
    pub scale: (f64, f64),
    /// Range of the crop aspect ratio w/h (default 3/4..4/3).
    pub ratio: (f64, f64),
    /// Probability of a horizontal flip (default 0.5).
    pub flip: f64,
    /// Take the whole image instead of a random crop (`scale` and `ratio` unused): a resize
    /// to `height × width` that does not keep the aspect ratio, as torchvision's
    /// `Resize((h, w))`, for recipes (detection) that keep every box.
    pub whole: bool,
}

impl RandomResizedCrop {
    /// torchvision's defaults: scale (0.08, 1.0), ratio (3/4, 4/3), flip 0.5.
    pub fn new(height: u32, width: u32) -> RandomResizedCrop {
        RandomResizedCrop {
            height,
            width,
            scale: (0.08, 1.0),
            ratio: (3.0 / 4.0, 4.0 / 3.0),
            flip: 0.5,
            whole: false,
        }
    }

    /// The whole image resized to `height × width`, flipped with probability `flip`.
    pub fn resize(height: u32, width: u32, flip: f64) -> RandomResizedCrop {
        RandomResizedCrop {
            scale: (1.0, 1.0),
            ratio: (1.0, 1.0),
            flip,
            whole: true,
            ..RandomResizedCrop::new(height, width)
        }
    }

    /// Checks the parameters.
    pub fn validate(&self) -> Result<()> {
        let ok = self.height > 0
            && self.width > 0
            && self.scale.0 > 0.0
            && self.scale.0 <= self.scale.1
            && self.scale.1 <= 1.0
            && self.ratio.0 > 0.0
            && self.ratio.0 <= self.ratio.1
            && (0.0..=1.0).contains(&self.flip);
        if ok {
            Ok(())
        } else {
            Err(Error::InvalidConfig(format!(
                "invalid augmentation {self:?}"
            )))
        }
    }

    /// Crop window `(top, left, h, w)` for an `ih × iw` image.
    pub fn crop_params(&self, ih: u32, iw: u32, rng: &mut SplitMix64) -> (u32, u32, u32, u32) {
        if self.whole {
            return (0, 0, ih, iw);
        }
        let area = ih as f64 * iw as f64;
        let (lr0, lr1) = (self.ratio.0.ln(), self.ratio.1.ln());
        for _ in 0..10 {
            let target = area * rng.uniform(self.scale.0, self.scale.1);
            let aspect = rng.uniform(lr0, lr1).exp();
            let w = (target * aspect).sqrt().round() as i64;
            let h = (target / aspect).sqrt().round() as i64;
            if 0 < w && w <= iw as i64 && 0 < h && h <= ih as i64 {
                let top = rng.below(ih - h as u32 + 1);
                let left = rng.below(iw - w as u32 + 1);
                return (top, left, h as u32, w as u32);
            }
        }
        // Fallback: centre crop at the nearest allowed ratio.
        let in_ratio = iw as f64 / ih as f64;
        let (h, w) = if in_ratio < self.ratio.0 {
            (((iw as f64 / self.ratio.0).round() as u32).clamp(1, ih), iw)
        } else if in_ratio > self.ratio.1 {
            (ih, ((ih as f64 * self.ratio.1).round() as u32).clamp(1, iw))
        } else {
            (ih, iw)
        };
        ((ih - h) / 2, (iw - w) / 2, h, w)
    }

    /// The crop window and flip of an `ih × iw` image whose random stream is `key` (see
    /// [`item_key`]): what [`Augmenter::write`] applies, and what the padded output
    /// ([`Output::U8Padded`]) hands over so that the crop runs elsewhere (on a GPU) with the
    /// same draws.
    pub fn draw(&self, ih: u32, iw: u32, key: u64) -> Crop {
        let mut rng = SplitMix64::new(key);
        let (top, left, height, width) = self.crop_params(ih, iw, &mut rng);
        let flip = rng.next_f64() < self.flip;
        Crop {
            image: (ih, iw),
            window: (top, left, height, width),
            flip,
        }
    }

    /// Augments one `ih × iw × c` image into `dst` (`height × width × c` bytes).
    pub fn apply(
        &self,
        src: &[u8],
        ih: u32,
        iw: u32,
        c: u32,
        dst: &mut [u8],
        key: u64,
    ) -> Result<()> {
        Augmenter::default().write(
            src,
            (ih, iw, c),
            Some(self),
            key,
            &Output::U8Nhwc,
            ItemOut::U8(dst),
            false,
        )
    }
}

/// An item's place and draws in a padded batch ([`Output::U8Padded`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Crop {
    /// The image's rows and columns (it sits at the top left of its padded place).
    pub image: (u32, u32),
    /// The crop window: first row, first column, rows, columns (the whole image when the
    /// batch is not augmented).
    pub window: (u32, u32, u32, u32),
    /// Whether the resized crop is mirrored.
    pub flip: bool,
}

/// Key of an item's random stream.
pub fn item_key(seed: u64, epoch: u64, position: u64) -> u64 {
    let mut r = SplitMix64::new(seed ^ 0x6a6f_6164_6572_0001);
    let a = r.next_u64() ^ epoch.wrapping_mul(0x9e37_79b9_7f4a_7c15);
    let mut r = SplitMix64::new(a);
    r.next_u64() ^ position.wrapping_mul(0xd1b5_4a32_d192_ed03)
}

/// SplitMix64: tiny, fast, and good enough for augmentation parameters.
#[derive(Debug, Clone)]
pub struct SplitMix64(u64);

impl SplitMix64 {
    /// Seeds the generator.
    pub fn new(seed: u64) -> SplitMix64 {
        SplitMix64(seed)
    }

    /// Next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in `[0, 1)`.
    pub fn next_f64(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }

    /// Uniform in `[lo, hi)`.
    pub fn uniform(&mut self, lo: f64, hi: f64) -> f64 {
        lo + (hi - lo) * self.next_f64()
    }

    /// Uniform integer in `[0, n)` (`n > 0`).
    pub fn below(&mut self, n: u32) -> u32 {
        (((self.next_u64() >> 32) * n as u64) >> 32) as u32
    }
}

/// How a batch's images are written into its output buffer.
#[derive(Debug, Clone, PartialEq)]
pub enum Output {
    /// `(B, H, W, C)` uint8: the pixels as they are.
    U8Nhwc,
    /// `(B, C, H, W)` float32: `(pixel / 255 - mean[c]) / std[c]`, torchvision's `ToTensor`
    /// followed by `Normalize(mean, std)`.
    F32Nchw {
        /// Per-channel mean (of pixels scaled to `[0, 1]`).
        mean: Vec<f32>,
        /// Per-channel standard deviation (positive).
        std: Vec<f32>,
    },
    /// `(B, Hmax, Wmax, C)` uint8: each image as cached, not cropped, at the top left of a
    /// place as large as the batch's largest image (its last column and row repeated once
    /// beside it, zeros beyond), with each item's [`Crop`] drawn as the augmentation would
    /// draw it, for a batched crop, flip and normalization elsewhere (on a GPU; see
    /// `crate::collate::write_padded`).
    U8Padded,
}

impl Output {
    /// Checks `mean`/`std` against the images' channel count.
    pub fn validate(&self, channels: u32) -> Result<()> {
        match self {
            Output::U8Nhwc | Output::U8Padded => Ok(()),
            Output::F32Nchw { mean, std } => {
                let ok = mean.len() == channels as usize
                    && std.len() == channels as usize
                    && mean.iter().all(|m| m.is_finite())
                    && std.iter().all(|s| s.is_finite() && *s > 0.0);
                if ok {
                    Ok(())
                } else {
                    Err(Error::InvalidConfig(format!(
                        "normalization needs one finite mean and one positive std per channel ({channels}), got mean {mean:?} std {std:?}"
                    )))
                }
            }
        }
    }

    /// Whether the output is float32 (else uint8).
    pub fn is_float(&self) -> bool {
        matches!(self, Output::F32Nchw { .. })
    }

    /// The array shape for a batch of `[B, H, W, C]` images: `[B, C, H, W]` for float32.
    pub fn array_shape(&self, [b, h, w, c]: [usize; 4]) -> [usize; 4] {
        match self {
            Output::U8Nhwc | Output::U8Padded => [b, h, w, c],
            Output::F32Nchw { .. } => [b, c, h, w],
        }
    }

    /// Per-channel lookup tables from a byte to its normalized value.
    fn luts(&self) -> Vec<[f32; 256]> {
        match self {
            Output::U8Nhwc | Output::U8Padded => Vec::new(),
            Output::F32Nchw { mean, std } => mean
                .iter()
                .zip(std)
                .map(|(m, s)| std::array::from_fn(|v| (v as f32 / 255.0 - m) / s))
                .collect(),
        }
    }
}

/// Where one image of a batch is written.
#[derive(Debug)]
pub enum ItemOut<'a> {
    /// `H × W × C` bytes.
    U8(&'a mut [u8]),
    /// `C × H × W` floats.
    F32(&'a mut [f32]),
}

/// One thread's augmentation state: a fast_image_resize `Resizer` and a scratch image,
/// reused from item to item.
#[derive(Default)]
pub struct Augmenter {
    resizer: Resizer,
    scratch: Vec<u8>,
    luts: Option<(Output, Vec<[f32; 256]>)>,
}

impl std::fmt::Debug for Augmenter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Augmenter").finish_non_exhaustive()
    }
}

fn pixel_type(c: u32) -> Result<PixelType> {
    match c {
        1 => Ok(PixelType::U8),
        2 => Ok(PixelType::U8x2),
        3 => Ok(PixelType::U8x3),
        4 => Ok(PixelType::U8x4),
        _ => Err(Error::Collate(format!(
            "images of {c} channels cannot be resized (1 to 4)"
        ))),
    }
}

fn resize_err(e: impl std::fmt::Display) -> Error {
    Error::Collate(format!("resize: {e}"))
}

/// Writes the `h × w × c` image `src` into `dst` with every row mirrored (see
/// [`crate::mirror`]), as the `flip` stage.
fn mirror_into(src: &[u8], dst: &mut [u8], w: usize, c: usize) {
    let _cpu = crate::stages::enter(&crate::stages::client::FLIP);
    crate::mirror::mirror_into(src, dst, w, c);
}

impl Augmenter {
    /// Writes one `ih × iw × c` u8 image into `dst` in `output`'s layout: through `aug` (the
    /// crop and flip drawn from `key`, resized by fast_image_resize's convolution with a
    /// bilinear filter, which widens its support when downscaling, i.e. antialiased) when
    /// given, else as it is. `dst` must hold exactly the output image.
    #[allow(clippy::too_many_arguments)]
    pub fn write(
        &mut self,
        src: &[u8],
        (ih, iw, c): (u32, u32, u32),
        aug: Option<&RandomResizedCrop>,
        key: u64,
        output: &Output,
        dst: ItemOut<'_>,
        stream: bool,
    ) -> Result<()> {
        let (oh, ow) = aug.map_or((ih, iw), |a| (a.height, a.width));
        let n = oh as usize * ow as usize * c as usize;
        let dst_len = match &dst {
            ItemOut::U8(d) => d.len(),
            ItemOut::F32(d) => d.len(),
        };
        if src.len() != ih as usize * iw as usize * c as usize || dst_len != n {
            return Err(Error::Collate(format!(
                "image of {} bytes is not {ih}x{iw}x{c}, or its output of {dst_len} values is not {oh}x{ow}x{c}",
                src.len()
            )));
        }
        let Some(a) = aug else {
            return match dst {
                ItemOut::U8(d) => {
                    let _cpu = crate::stages::enter(&crate::stages::client::COPY);
                    crate::copy::copy(d, src, stream);
                    Ok(())
                }
                ItemOut::F32(d) => self.normalize(src, ow, c, false, output, d),
            };
        };
        // The flip and the normalization below are stages of their own, nested in this one.
        let _cpu = crate::stages::enter(&crate::stages::client::CROP_RESIZE);
        let Crop {
            window: (top, left, ch, cw),
            flip,
            ..
        } = a.draw(ih, iw, key);
        let options = ResizeOptions::new()
            .resize_alg(ResizeAlg::Convolution(FilterType::Bilinear))
            .use_alpha(false)
            .crop(
                f64::from(left),
                f64::from(top),
                f64::from(cw),
                f64::from(ch),
            );
        let pt = pixel_type(c)?;
        let src_img = ImageRef::new(iw, ih, src, pt).map_err(resize_err)?;
        match dst {
            ItemOut::U8(d) if !flip => {
                let mut out = Image::from_slice_u8(ow, oh, d, pt).map_err(resize_err)?;
                self.resizer
                    .resize(&src_img, &mut out, &options)
                    .map_err(resize_err)?;
                Ok(())
            }
            ItemOut::U8(d) => {
                // Resized into the scratch image, then mirrored into place in one pass.
                let mut scratch = std::mem::take(&mut self.scratch);
                scratch.resize(n, 0);
                let mut out = Image::from_slice_u8(ow, oh, &mut scratch, pt).map_err(resize_err)?;
                let r = self.resizer.resize(&src_img, &mut out, &options);
                if r.is_ok() {
                    mirror_into(&scratch, d, ow as usize, c as usize);
                }
                self.scratch = scratch;
                r.map_err(resize_err)
            }
            ItemOut::F32(d) => {
                let mut scratch = std::mem::take(&mut self.scratch);
                scratch.resize(n, 0);
                let mut out = Image::from_slice_u8(ow, oh, &mut scratch, pt).map_err(resize_err)?;
                self.resizer
                    .resize(&src_img, &mut out, &options)
                    .map_err(resize_err)?;
                let r = self.normalize(&scratch, ow, c, flip, output, d);
                self.scratch = scratch;
                r
            }
        }
    }

    /// HWC bytes to normalized CHW floats, mirrored when `flip`.
    fn normalize(
        &mut self,
        src: &[u8],
        w: u32,
        c: u32,
        flip: bool,
        output: &Output,
        dst: &mut [f32],
    ) -> Result<()> {
        let _cpu = crate::stages::enter(&crate::stages::client::NORMALIZE);
        if self.luts.as_ref().is_none_or(|(o, _)| o != output) {
            output.validate(c)?;
            self.luts = Some((output.clone(), output.luts()));
        }
        let Some((_, luts)) = &self.luts else {
            return Ok(());
        };
        let (w, c) = (w as usize, c as usize);
        let plane = src.len() / c;
        for (k, (out, lut)) in dst.chunks_exact_mut(plane).zip(luts).enumerate() {
            for (orow, srow) in out.chunks_exact_mut(w).zip(src.chunks_exact(w * c)) {
                if flip {
                    for (x, o) in orow.iter_mut().enumerate() {
                        *o = lut[srow[(w - 1 - x) * c + k] as usize];
                    }
                } else {
                    for (x, o) in orow.iter_mut().enumerate() {
                        *o = lut[srow[x * c + k] as usize];
                    }
                }
            }
        }
        Ok(())
    }
}
#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn crop_params_stay_inside_and_follow_scale() {
        let aug = RandomResizedCrop::new(8, 8);
        let mut rng = SplitMix64::new(1);
        let mut areas = 0.0;
        for _ in 0..2000 {
            let (t, l, h, w) = aug.crop_params(100, 150, &mut rng);
            assert!(
                h >= 1 && w >= 1 && t + h <= 100 && l + w <= 150,
                "{t} {l} {h} {w}"
            );
            areas += (h * w) as f64 / 15000.0;
        }
        let mean = areas / 2000.0;
        // Uniform area fraction in [0.08, 1] has mean 0.54 (minus rejected draws).
        assert!((0.35..0.6).contains(&mean), "mean area fraction {mean}");
    }

    #[test]
    fn whole_image_crop_copies_and_flip_mirrors() {
        let src: Vec<u8> = (0..(4 * 5 * 3)).map(|i| i as u8).collect();
        let mut aug = RandomResizedCrop::new(4, 5);
        aug.scale = (1.0, 1.0);
        aug.ratio = (5.0 / 4.0, 5.0 / 4.0);
        aug.flip = 0.0;
        let mut dst = vec![0u8; src.len()];
        aug.apply(&src, 4, 5, 3, &mut dst, 9).unwrap();
        assert_eq!(src, dst);
        aug.flip = 1.0;
        aug.apply(&src, 4, 5, 3, &mut dst, 9).unwrap();
        for y in 0..4 {
            for x in 0..5 {
                for k in 0..3 {
                    assert_eq!(dst[(y * 5 + x) * 3 + k], src[(y * 5 + (4 - x)) * 3 + k]);
                }
            }
        }
    }

    #[test]
    fn downscaling_is_antialiased() {
        // One-pixel black and white columns: point sampling would keep 0s and 255s, a filter
        // whose support widens with the scale averages them.
        let (h, w) = (64u32, 64u32);
        let src: Vec<u8> = (0..h * w * 3)
            .map(|i| if (i / 3) % 2 == 0 { 0 } else { 255 })
            .collect();
        let mut aug = RandomResizedCrop::new(16, 16);
        aug.scale = (1.0, 1.0);
        aug.ratio = (1.0, 1.0);
        let mut dst = vec![0u8; 16 * 16 * 3];
        aug.apply(&src, h, w, 3, &mut dst, 1).unwrap();
        assert!(dst.iter().all(|&v| (100..=155).contains(&v)), "{dst:?}");
    }

    #[test]
    fn fallback_is_the_central_crop_at_the_nearest_ratio() {
        // A 10×100 strip: no crop of at least 99% of the area has a ratio within [3/4, 4/3].
        let mut aug = RandomResizedCrop::new(8, 8);
        aug.scale = (0.99, 1.0);
        let mut rng = SplitMix64::new(5);
        assert_eq!(aug.crop_params(10, 100, &mut rng), (0, 43, 10, 13));
        assert_eq!(aug.crop_params(100, 10, &mut rng), (43, 0, 13, 10));
    }

    #[test]
    fn float_output_is_the_normalized_transposed_bytes() {
        let src: Vec<u8> = (0..(30 * 40 * 3)).map(|i| (i * 7 % 253) as u8).collect();
        let aug = RandomResizedCrop::new(12, 10);
        let out = Output::F32Nchw {
            mean: vec![0.5, 0.25, 0.0],
            std: vec![0.5, 2.0, 1.0],
        };
        let mut a = Augmenter::default();
        for key in 0..8 {
            let mut bytes = vec![0u8; 12 * 10 * 3];
            let mut floats = vec![0f32; 12 * 10 * 3];
            let (dims, fmt) = ((30, 40, 3), &Output::U8Nhwc);
            a.write(
                &src,
                dims,
                Some(&aug),
                key,
                fmt,
                ItemOut::U8(&mut bytes),
                false,
            )
            .unwrap();
            a.write(
                &src,
                dims,
                Some(&aug),
                key,
                &out,
                ItemOut::F32(&mut floats),
                false,
            )
            .unwrap();
            let Output::F32Nchw { mean, std } = &out else {
                unreachable!()
            };
            for k in 0..3 {
                for p in 0..120 {
                    let want = (bytes[p * 3 + k] as f32 / 255.0 - mean[k]) / std[k];
                    assert!((floats[k * 120 + p] - want).abs() < 1e-6);
                }
            }
        }
        // Without augmentation: the image itself, normalized.
        let mut floats = vec![0f32; 30 * 40 * 3];
        a.write(
            &src,
            (30, 40, 3),
            None,
            0,
            &out,
            ItemOut::F32(&mut floats),
            false,
        )
        .unwrap();
        assert!((floats[1] - ((src[3] as f32 / 255.0 - 0.5) / 0.5)).abs() < 1e-6);
        let bad = Output::F32Nchw {
            mean: vec![0.5],
            std: vec![0.5],
        };
        let err = a.write(
            &src,
            (30, 40, 3),
            None,
            0,
            &bad,
            ItemOut::F32(&mut floats),
            false,
        );
        assert_eq!(err.unwrap_err().code(), "invalid_config");
    }

    #[test]
    fn constant_image_stays_constant() {
        let src = vec![77u8; 30 * 20 * 3];
        let aug = RandomResizedCrop::new(13, 17);
        let mut dst = vec![0u8; 13 * 17 * 3];
        for key in 0..20 {
            aug.apply(&src, 30, 20, 3, &mut dst, key).unwrap();
            assert!(dst.iter().all(|&v| v == 77));
        }
    }

    #[test]
    fn draw_is_what_apply_applies() {
        // An image whose columns differ: a flipped crop is the mirror of the same crop unflipped.
        let src: Vec<u8> = (0..(40 * 60 * 3))
            .map(|i| ((i / 3) % 60 * 4) as u8)
            .collect();
        let aug = RandomResizedCrop::new(8, 8);
        let still = RandomResizedCrop { flip: 0.0, ..aug };
        let (mut a, mut b, mut flips) = (vec![0u8; 192], vec![0u8; 192], 0);
        for key in 0..40 {
            let d = aug.draw(40, 60, key);
            assert_eq!(d.image, (40, 60));
            assert_eq!(still.draw(40, 60, key).window, d.window);
            aug.apply(&src, 40, 60, 3, &mut a, key).unwrap();
            still.apply(&src, 40, 60, 3, &mut b, key).unwrap();
            if d.flip {
                flips += 1;
                let mut m = vec![0u8; 192];
                mirror_into(&b, &mut m, 8, 3);
                assert_eq!(a, m, "key {key}");
            } else {
                assert_eq!(a, b, "key {key}");
            }
        }
        assert!((5..35).contains(&flips), "{flips}");
    }

    #[test]
    fn resize_takes_the_whole_image() {
        // Columns that differ, rows alike: a whole-image resize keeps the first and last
        // columns' values at the edges, a flip swaps them.
        let src: Vec<u8> = (0..(30 * 50 * 3))
            .map(|i| ((i / 3) % 50 * 5) as u8)
            .collect();
        let (still, flipping) = (
            RandomResizedCrop::resize(12, 20, 0.0),
            RandomResizedCrop::resize(12, 20, 1.0),
        );
        let mut out = vec![0u8; 12 * 20 * 3];
        for key in 0..10 {
            let d = still.draw(30, 50, key);
            assert_eq!((d.window, d.flip), ((0, 0, 30, 50), false));
            assert!(flipping.draw(30, 50, key).flip);
            still.apply(&src, 30, 50, 3, &mut out, key).unwrap();
            let (first, last) = (out[0], out[19 * 3]);
            assert!(first < 20 && last > 225, "{first} {last}");
            flipping.apply(&src, 30, 50, 3, &mut out, key).unwrap();
            assert_eq!((out[0], out[19 * 3]), (last, first));
        }
    }

    #[test]
    fn flip_rate_is_about_half() {
        let aug = RandomResizedCrop::new(4, 4);
        let flips = (0..4000)
            .filter(|&p| {
                let mut rng = SplitMix64::new(item_key(3, 0, p));
                aug.crop_params(50, 50, &mut rng);
                rng.next_f64() < 0.5
            })
            .count();
        assert!((1800..2200).contains(&flips), "{flips}");
    }
}
