//! Bulk copies out of shared memory.
//!
//! Collating a large batch writes far more than the caches hold, so on
//! x86_64 the copy uses non-temporal (streaming) stores: they skip the
//! read-for-ownership of every destination line and do not evict the
//! caller's working set. That is what glibc's `memcpy` does for one large
//! copy, but not for the ~150 KB per-image copies of a collate, which is
//! why a plain per-item `copy_from_slice` runs well below `memcpy` speed.
//! SSE2 is part of the x86_64 baseline, so no runtime detection is needed.
#![allow(unsafe_code)]

/// Batches at least this large are collated with streaming stores.
pub(crate) const STREAM_THRESHOLD: usize = 8 << 20;

/// Copies `src` into `dst` (same length), with streaming stores if `stream`.
pub(crate) fn copy(dst: &mut [u8], src: &[u8], stream: bool) {
    assert_eq!(dst.len(), src.len(), "copy length mismatch");
    #[cfg(target_arch = "x86_64")]
    if stream && src.len() >= 4096 {
        return copy_stream(dst, src);
    }
    let _ = stream;
    dst.copy_from_slice(src);
}

#[cfg(target_arch = "x86_64")]
fn copy_stream(dst: &mut [u8], src: &[u8]) {
    use std::arch::x86_64::{__m128i, _mm_loadu_si128, _mm_sfence, _mm_stream_si128};
    let len = dst.len();
    // Unaligned head up to a 16-byte boundary of the destination.
    let head = dst.as_ptr().align_offset(16).min(len);
    dst[..head].copy_from_slice(&src[..head]);
    let body = (len - head) / 64 * 64;
    let s = src[head..head + body].as_ptr();
    let d = dst[head..head + body].as_mut_ptr();
    let mut i = 0;
    while i < body {
        // SAFETY: `i + 64 <= body`, so the four 16-byte loads stay inside
        // `src[head..head+body]` and the four stores inside
        // `dst[head..head+body]`; `d + i` is 16-byte aligned (`head` aligned
        // `d`, `i` is a multiple of 64); unaligned loads are allowed by
        // `_mm_loadu_si128`; SSE2 is always available on x86_64; `src` and
        // `dst` do not overlap (one is shared memory mapped read-only to us
        // or a distinct borrow, the other a `&mut`).
        unsafe {
            let sp = s.add(i).cast::<__m128i>();
            let dp = d.add(i).cast::<__m128i>();
            let a = _mm_loadu_si128(sp);
            let b = _mm_loadu_si128(sp.add(1));
            let c = _mm_loadu_si128(sp.add(2));
            let e = _mm_loadu_si128(sp.add(3));
            _mm_stream_si128(dp, a);
            _mm_stream_si128(dp.add(1), b);
            _mm_stream_si128(dp.add(2), c);
            _mm_stream_si128(dp.add(3), e);
        }
        i += 64;
    }
    // SAFETY: a store fence has no memory-safety preconditions; it orders the
    // streaming stores above before anything the caller does next.
    unsafe { _mm_sfence() };
    dst[head + body..].copy_from_slice(&src[head + body..]);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn streaming_copy_is_exact_for_every_alignment_and_length() {
        let src: Vec<u8> = (0..20_000u32).map(|i| (i * 7 + 3) as u8).collect();
        for off in 0..17 {
            for len in [0, 1, 15, 64, 4095, 4096, 4097, 10_000, 19_000 - off] {
                let mut dst = vec![0u8; len + 32];
                copy(&mut dst[off..off + len], &src[off..off + len], true);
                assert_eq!(
                    &dst[off..off + len],
                    &src[off..off + len],
                    "off {off} len {len}"
                );
                assert!(dst[..off].iter().all(|&b| b == 0));
                assert!(dst[off + len..].iter().all(|&b| b == 0));
            }
        }
    }
}
