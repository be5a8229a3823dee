//! DCT-scaled JPEG decoding: when the pipeline resizes down, libjpeg-turbo (vendored and built
//! with its SIMD by the `mozjpeg` crate) decodes at 1/2, 1/4 or 1/8 scale in the DCT domain, so
//! that only what the resize needs is inverse-transformed, upsampled and colour-converted.
//! fast_image_resize then resizes the rest.
//!
//! Why libjpeg-turbo here and zune-jpeg elsewhere: the comparison table in `ARCHITECTURE.md`
//! (zune-jpeg cannot scale; jpeg-decoder's scaled IDCT is slower and misses the ≤ 2 levels of
//! mean difference at 1/8; the pure-Rust libjpeg-turbo port was slower than the C one).
//!
//! Strictness: libjpeg treats a truncated or damaged entropy stream as a warning and pads the
//! image with grey, and the `mozjpeg` crate silences warnings. A file whose entropy-coded data
//! has no end-of-image marker after its first scan is therefore refused as corrupt before
//! libjpeg sees it, which is what a cut-off file looks like. Fatal libjpeg errors unwind out of
//! the C code (the crate's error manager); they are caught here and become
//! [`PipelineError::Corrupt`].

use std::panic::{AssertUnwindSafe, catch_unwind};

use super::PipelineError;
use super::decode::Rgb;

/// The largest DCT scale denominator (8, 4, 2 or 1) at which a `width`×`height` JPEG still
/// decodes to at least 1.25 × `need_w`×`need_h` pixels (libjpeg's scaled size is the stored
/// size divided by the denominator, rounded up).
///
/// Why the margin of a quarter: a scaled IDCT keeps detail up to its new Nyquist limit, where
/// the full path's antialiased bilinear reduction softens it; when the scaled output is the
/// target size itself no resize filters it at all, and the two paths differed by 2.3 levels on
/// average on scikit-image's astronaut (512×512 to 256). With a residual reduction of 1.25× or
/// more the bilinear filter evens that out (≤ 2 levels on every test photo). The benchmark's
/// sizes decode at 375 rows for a 256 target, so the margin costs them nothing.
pub(super) fn dct_scale(width: u32, height: u32, need_w: u32, need_h: u32) -> u32 {
    let covers =
        |side: u32, k: u32, need: u32| u64::from(side.div_ceil(k)) * 4 >= u64::from(need) * 5;
    [8, 4, 2]
        .into_iter()
        .find(|&k| covers(width, k, need_w) && covers(height, k, need_h))
        .unwrap_or(1)
}

/// Decodes `bytes` (a JPEG of `stored` size whose header zune-jpeg has already checked,
/// including the pixel limit) at scale `1/scale` to RGB8.
pub(super) fn decode(bytes: &[u8], stored: (u32, u32), scale: u32) -> Result<Rgb, PipelineError> {
    if !has_end_after_first_scan(bytes) {
        return Err(PipelineError::Corrupt(
            "jpeg: truncated (no end-of-image marker after the scan data)".into(),
        ));
    }
    let numerator = u8::try_from(8 / scale).unwrap_or(8);
    let result = catch_unwind(AssertUnwindSafe(|| -> std::io::Result<Rgb> {
        let mut dec = mozjpeg::Decompress::new_mem(bytes)?;
        dec.scale(numerator);
        let mut started = dec.rgb()?;
        let (width, height) = (started.width() as u32, started.height() as u32);
        let data = started.read_scanlines::<u8>()?;
        started.finish()?;
        Ok(Rgb {
            data,
            width,
            height,
            scale,
            stored,
        })
    }));
    let img = match result {
        Ok(Ok(img)) => img,
        Ok(Err(e)) => return Err(PipelineError::Corrupt(format!("jpeg: {e}").to_lowercase())),
        Err(panic) => {
            let msg = panic
                .downcast_ref::<String>()
                .map(String::as_str)
                .or_else(|| panic.downcast_ref::<&str>().copied())
                .unwrap_or("libjpeg failed");
            return Err(PipelineError::Corrupt(
                format!("jpeg: {msg}").to_lowercase(),
            ));
        }
    };
    let expected = (stored.0.div_ceil(scale), stored.1.div_ceil(scale));
    if (img.width, img.height) != expected
        || img.data.len() != img.width as usize * img.height as usize * 3
    {
        return Err(PipelineError::Corrupt(format!(
            "jpeg: scaled decode gave {}x{} pixels, expected {}x{}",
            img.width, img.height, expected.0, expected.1
        )));
    }
    Ok(img)
}

/// True if an end-of-image marker (`FF D9`) follows the header of the first scan (`FF DA`).
///
/// The marker segments before the first scan are skipped by their lengths, so an EXIF
/// thumbnail (a whole JPEG inside an APP1 segment, with its own end marker) does not count.
/// Inside entropy-coded data a `FF` byte is always followed by `00` or a restart marker, so the
/// first `FF D9` found after the scan header is a real end of image (progressive files have
/// further scans before it), and any `FF D9` after it is one too.
fn has_end_after_first_scan(bytes: &[u8]) -> bool {
    let mut pos = 2; // after SOI
    loop {
        // Markers may be preceded by any number of fill bytes 0xFF.
        while bytes.get(pos) == Some(&0xFF) && bytes.get(pos + 1) == Some(&0xFF) {
            pos += 1;
        }
        let (Some(&0xFF), Some(&marker)) = (bytes.get(pos), bytes.get(pos + 1)) else {
            return false;
        };
        let Some(len) = bytes.get(pos + 2..pos + 4) else {
            return false;
        };
        let segment_end = pos + 2 + usize::from(u16::from_be_bytes([len[0], len[1]]));
        if marker == 0xDA {
            let Some(rest) = bytes.get(segment_end..) else {
                return false;
            };
            // From the end: a whole file ends with it (at most some trailing bytes after),
            // so the search stops at once instead of reading megabytes of entropy data.
            return rest.windows(2).rev().any(|w| w == [0xFF, 0xD9]);
        }
        pos = segment_end;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scale_is_the_largest_that_still_covers_the_need() {
        assert_eq!(dct_scale(500, 375, 341, 256), 1);
        assert_eq!(dct_scale(1000, 750, 341, 256), 2);
        // 2000 / 8 = 250 < 256: a quarter.
        assert_eq!(dct_scale(2000, 1500, 341, 256), 4);
        assert_eq!(dct_scale(4000, 3000, 341, 256), 8);
        // A quarter of margin, sides rounded up: 2553 / 8 = 319.1 -> 320 = 1.25 × 256.
        assert_eq!(dct_scale(2553, 3800, 256, 376), 8);
        assert_eq!(dct_scale(2552, 3800, 256, 376), 4);
        assert_eq!(dct_scale(2553, 3752, 256, 376), 4);
        // Exactly the target size is not enough (512 / 2 = 256).
        assert_eq!(dct_scale(512, 512, 256, 256), 1);
        assert_eq!(dct_scale(640, 640, 256, 256), 2);
        // An upscale never scales.
        assert_eq!(dct_scale(100, 100, 200, 200), 1);
    }

    #[test]
    fn end_marker_is_looked_for_after_the_first_scan_only() {
        let scan = [0xFF, 0xDA, 0x00, 0x02];
        // An APP1 segment that holds a whole thumbnail, end marker included.
        let app1 = [0xFF, 0xE1, 0x00, 0x06, 0xFF, 0xD8, 0xFF, 0xD9];
        let mut cut = vec![0xFF, 0xD8];
        cut.extend_from_slice(&app1);
        cut.extend_from_slice(&scan);
        cut.extend_from_slice(&[0x12, 0xFF, 0x00, 0x34]);
        assert!(!has_end_after_first_scan(&cut));
        let mut whole = cut.clone();
        whole.extend_from_slice(&[0xFF, 0xD9]);
        assert!(has_end_after_first_scan(&whole));
        // Fill bytes before a marker, and a header cut inside a segment.
        let mut filled = vec![0xFF, 0xD8, 0xFF, 0xFF];
        filled.extend_from_slice(&scan);
        filled.extend_from_slice(&[0x01, 0xFF, 0xD9]);
        assert!(has_end_after_first_scan(&filled));
        assert!(!has_end_after_first_scan(&whole[..7]));
        assert!(!has_end_after_first_scan(&[0xFF, 0xD8]));
    }
}
