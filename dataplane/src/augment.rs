//! Per-job augmentation applied by the client after the shared cache:
//! random resized crop (torchvision's parameter sampling) with bilinear
//! resampling, and horizontal flip.
//!
//! The randomness of an item depends only on the job's seed, the epoch and
//! the item's position in the epoch ([`item_key`]), never on batch
//! boundaries or thread scheduling, so a job with a fixed seed augments
//! reproducibly whenever its order is reproducible.

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

    /// Augments one `ih × iw × c` image into `dst` (`height × width × c` bytes).
    pub fn apply(&self, src: &[u8], ih: u32, iw: u32, c: u32, dst: &mut [u8], key: u64) {
        let mut rng = SplitMix64::new(key);
        let (top, left, ch, cw) = self.crop_params(ih, iw, &mut rng);
        let flip = rng.next_f64() < self.flip;
        resize_bilinear(
            src,
            iw as usize,
            c as usize,
            (top, left, ch, cw),
            dst,
            self.height,
            self.width,
            flip,
        );
    }
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

/// Source index pairs and 8-bit weights along one axis (half-pixel centres).
fn axis_taps(start: u32, len: u32, out: u32) -> Vec<(usize, usize, u32)> {
    let scale = len as f64 / out as f64;
    (0..out)
        .map(|o| {
            let s = ((o as f64 + 0.5) * scale - 0.5).clamp(0.0, (len - 1) as f64);
            let i0 = s.floor() as u32;
            let i1 = (i0 + 1).min(len - 1);
            let f = ((s - i0 as f64) * 256.0).round() as u32;
            ((start + i0) as usize, (start + i1) as usize, f.min(256))
        })
        .collect()
}

#[allow(clippy::too_many_arguments)]
fn resize_bilinear(
    src: &[u8],
    iw: usize,
    c: usize,
    (top, left, ch, cw): (u32, u32, u32, u32),
    dst: &mut [u8],
    oh: u32,
    ow: u32,
    flip: bool,
) {
    let rows = axis_taps(top, ch, oh);
    let mut cols = axis_taps(left, cw, ow);
    if flip {
        cols.reverse();
    }
    let stride = iw * c;
    for (oy, &(y0, y1, fy)) in rows.iter().enumerate() {
        let r0 = &src[y0 * stride..(y0 + 1) * stride];
        let r1 = &src[y1 * stride..(y1 + 1) * stride];
        let out = &mut dst[oy * ow as usize * c..(oy + 1) * ow as usize * c];
        for (ox, &(x0, x1, fx)) in cols.iter().enumerate() {
            for k in 0..c {
                let p00 = r0[x0 * c + k] as u32;
                let p01 = r0[x1 * c + k] as u32;
                let p10 = r1[x0 * c + k] as u32;
                let p11 = r1[x1 * c + k] as u32;
                let top = p00 * (256 - fx) + p01 * fx;
                let bot = p10 * (256 - fx) + p11 * fx;
                out[ox * c + k] = ((top * (256 - fy) + bot * fy + (1 << 15)) >> 16) as u8;
            }
        }
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
    fn identity_resize_without_flip_copies() {
        let src: Vec<u8> = (0..(4 * 5 * 3)).map(|i| i as u8).collect();
        let mut dst = vec![0u8; src.len()];
        resize_bilinear(&src, 5, 3, (0, 0, 4, 5), &mut dst, 4, 5, false);
        assert_eq!(src, dst);
        resize_bilinear(&src, 5, 3, (0, 0, 4, 5), &mut dst, 4, 5, true);
        for y in 0..4 {
            for x in 0..5 {
                for k in 0..3 {
                    assert_eq!(dst[(y * 5 + x) * 3 + k], src[(y * 5 + (4 - x)) * 3 + k]);
                }
            }
        }
    }

    #[test]
    fn constant_image_stays_constant() {
        let src = vec![77u8; 30 * 20 * 3];
        let aug = RandomResizedCrop::new(13, 17);
        let mut dst = vec![0u8; 13 * 17 * 3];
        for key in 0..20 {
            aug.apply(&src, 30, 20, 3, &mut dst, key);
            assert!(dst.iter().all(|&v| v == 77));
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
