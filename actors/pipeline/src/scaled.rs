//! DCT-scaled JPEG decoding: when the pipeline resizes down, libjpeg-turbo (vendored and built
//! with its SIMD by the `mozjpeg` crate) decodes at M/8 of the stored size in the DCT domain
//! (M one of [`DCT_EIGHTHS`] by default), so that only what the resize needs is
//! inverse-transformed, upsampled and colour-converted. fast_image_resize then resizes the
//! rest.
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

/// The DCT scales [`crate::run`] decodes at, in eighths of the stored size (libjpeg's
/// `scale_num` over a `scale_denom` of 8); full size is the fallback.
///
/// 1/8, 1/4 and 1/2 have SIMD inverse DCTs on x86-64 (`jidctred.c` and its assembly, with
/// 4:2:0 chroma taken through the 8×8 SIMD one at 1/2); every other M/8 runs libjpeg's plain
/// C `jidctint.c`, 4:2:0 chroma through a 2M×2M one (14×14 at 7/8) so that it needs no
/// upsampling. Each was kept only where `joader bench decode --eighths …` showed it faster
/// than zune-jpeg's full decode on the same photos (figures in `ARCHITECTURE.md`): 5/8 was,
/// by about 9 % on 800×600 photos (shorter sides 511 to 638 take it for a 256 target); 6/8
/// tied with it (600×450) and 7/8 was 15–35 % slower (500×375, 600×450, 800×600), so they
/// stay out, and 3/8 tied with 1/2 (1300×975). [`crate::run_with_scales`] still tries them.
pub const DCT_EIGHTHS: &[u32] = &[1, 2, 4, 5];

/// The size of one side decoded at `eighths`/8: libjpeg rounds up (`jdiv_round_up(side * M,
/// 8)` in `jdmaster.c`).
pub(super) fn scaled_side(side: u32, eighths: u32) -> u32 {
    // A JPEG side is at most 65535, so the product fits.
    (side * eighths).div_ceil(8)
}

/// The smallest scale among `eighths` (M of M/8, any order; values outside 1..=7 are
/// ignored) at which a `width`×`height` JPEG still decodes to at least 1.25 ×
/// `need_w`×`need_h` pixels, or 8 (full size) when none does.
///
/// Why the margin of a quarter: a scaled IDCT keeps detail up to its new Nyquist limit, where
/// the full path's antialiased bilinear reduction softens it; when the scaled output is the
/// target size itself no resize filters it at all, and the two paths differed by 2.3 levels on
/// average on scikit-image's astronaut (512×512 to 256). With a residual reduction of 1.25× or
/// more the bilinear filter evens that out (≤ 2 levels on every test photo). The benchmark's
/// sizes decode at 375 rows for a 256 target, so the margin costs them nothing.
pub(super) fn dct_eighths(
    eighths: &[u32],
    width: u32,
    height: u32,
    need_w: u32,
    need_h: u32,
) -> u32 {
    let covers =
        |side: u32, m: u32, need: u32| u64::from(scaled_side(side, m)) * 4 >= u64::from(need) * 5;
    eighths
        .iter()
        .copied()
        .filter(|&m| (1..8).contains(&m) && covers(width, m, need_w) && covers(height, m, need_h))
        .min()
        .unwrap_or(8)
}

/// Decodes `bytes` (a JPEG of `stored` size whose header zune-jpeg has already checked,
/// including the pixel limit) at `eighths`/8 of its size (1 to 7) to RGB8: exactly
/// ⌈side × `eighths` / 8⌉ pixels a side, or an error.
pub(super) fn decode(bytes: &[u8], stored: (u32, u32), eighths: u32) -> Result<Rgb, PipelineError> {
    if !has_end_after_first_scan(bytes) {
        return Err(PipelineError::Corrupt(
            "jpeg: truncated (no end-of-image marker after the scan data)".into(),
        ));
    }
    let numerator = u8::try_from(eighths)
        .ok()
        .filter(|m| (1..8).contains(m))
        .ok_or_else(|| PipelineError::Corrupt(format!("jpeg: no dct scale {eighths}/8")))?;
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
            eighths,
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
    let expected = (
        scaled_side(stored.0, eighths),
        scaled_side(stored.1, eighths),
    );
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
    fn scale_is_the_smallest_that_still_covers_the_need() {
        let pick = |w, h, nw, nh| dct_eighths(DCT_EIGHTHS, w, h, nw, nh);
        // 7/8 and 6/8 measured no faster than the full decode: 500x375 and 600x450 stay at
        // full size; 5/8 was faster, from 511 rows (⌈511 × 5 / 8⌉ = 320 = 1.25 × 256).
        assert_eq!(pick(500, 375, 341, 256), 8);
        assert_eq!(pick(600, 450, 341, 256), 8);
        assert_eq!(pick(800, 600, 341, 256), 5);
        assert_eq!(pick(683, 511, 341, 256), 5);
        assert_eq!(pick(683, 510, 341, 256), 8);
        assert_eq!(pick(851, 638, 341, 256), 5);
        assert_eq!(pick(1000, 750, 341, 256), 4);
        // 2000 / 8 = 250 < 256: a quarter.
        assert_eq!(pick(2000, 1500, 341, 256), 2);
        assert_eq!(pick(4000, 3000, 341, 256), 1);
        // A quarter of margin, sides rounded up: 2553 / 8 = 319.1 -> 320 = 1.25 × 256.
        assert_eq!(pick(2553, 3800, 256, 376), 1);
        assert_eq!(pick(2552, 3800, 256, 376), 2);
        assert_eq!(pick(2553, 3752, 256, 376), 2);
        // Exactly the target size is not enough: 512 / 2 = 256, so 5/8 (320); 409 × 5 / 8
        // rounds up to 256, so full size.
        assert_eq!(pick(512, 512, 256, 256), 5);
        assert_eq!(pick(409, 409, 256, 256), 8);
        assert_eq!(pick(640, 640, 256, 256), 4);
        // An upscale never scales.
        assert_eq!(pick(100, 100, 200, 200), 8);
    }

    #[test]
    fn sizes_just_too_small_for_a_half_take_seven_eighths_when_it_is_enabled() {
        let with_7 = [1, 2, 4, 7];
        let pick = |w, h, nw, nh| dct_eighths(&with_7, w, h, nw, nh);
        // 375 × 7 / 8 = 328.1 -> 329 >= 320 (1.25 × 256); a half would be 188.
        assert_eq!(pick(500, 375, 341, 256), 7);
        // The band for a 256 target: ⌈s × 7 / 8⌉ >= 320 from s = 365, until a half covers
        // (⌈s / 2⌉ >= 320 from s = 639).
        assert_eq!(pick(487, 365, 341, 256), 7);
        assert_eq!(pick(485, 364, 341, 256), 8);
        assert_eq!(pick(851, 638, 341, 256), 7);
        assert_eq!(pick(853, 639, 341, 256), 4);
        // Both sides must be covered: a portrait whose long side is short of 1.25 × need.
        assert_eq!(pick(400, 480, 256, 410), 8);
        assert_eq!(pick(400, 586, 256, 375), 7);
        // Scales that cover are still taken smallest first.
        assert_eq!(pick(4000, 3000, 341, 256), 1);
        assert_eq!(pick(100, 100, 200, 200), 8);
        // Every M/8 when all are allowed: 600x450 to 256 at 6/8 (338 rows), 800x600 at 5/8
        // (375), 1300x975 at 3/8 (366).
        let every = [1, 2, 3, 4, 5, 6, 7];
        assert_eq!(dct_eighths(&every, 600, 450, 341, 256), 6);
        assert_eq!(dct_eighths(&every, 800, 600, 341, 256), 5);
        assert_eq!(dct_eighths(&every, 1300, 975, 341, 256), 3);
        // Any order; values that are no M/8 are ignored; none at all is full size.
        assert_eq!(dct_eighths(&[7, 4, 2, 1], 500, 375, 341, 256), 7);
        assert_eq!(dct_eighths(&[0, 8, 9, 16], 4000, 3000, 341, 256), 8);
        assert_eq!(dct_eighths(&[], 4000, 3000, 341, 256), 8);
    }

    #[test]
    fn scaled_sides_round_up_as_libjpeg_does() {
        assert_eq!(scaled_side(375, 7), 329);
        assert_eq!(scaled_side(500, 7), 438);
        assert_eq!(scaled_side(8, 7), 7);
        assert_eq!(scaled_side(9, 7), 8);
        assert_eq!(scaled_side(1, 1), 1);
        assert_eq!(scaled_side(1001, 4), 501);
        assert_eq!(scaled_side(65535, 7), 57344);
        assert_eq!(scaled_side(65535, 8), 65535);
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
