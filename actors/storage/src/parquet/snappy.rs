//! Snappy's raw format, decoded so that one value of a page can later be decompressed alone.
//!
//! A page's first read decompresses it whole (the `parquet` crate does), and [`elements`]
//! lists the stream's elements (literals and back-references) and where each one's output
//! begins, reading their tags only. From that list, [`span`] finds for a value's bytes the smallest piece of the compressed stream
//! that produces them: it starts at the value, or earlier where a back-reference inside it
//! reaches before it (Snappy's compressors reference at most 64 KiB back), possibly in the
//! middle of a literal. [`decode_span`] decompresses that piece alone. Pages of JPEGs are
//! nearly all literals, so a value's piece is about the value's own bytes.
//!
//! Written here rather than taken from the `snap` crate (which the `parquet` crate uses to
//! decompress whole pages): `snap` has no way to start in the middle of a stream or to say
//! what each element references, and the format is a few dozen lines.

/// An element of a Snappy stream.
#[derive(Clone, Copy, Debug)]
pub(super) struct Element {
    /// Where its payload begins in the stream: a literal's bytes (after its tag), or the end
    /// of a back-reference's tag.
    body: u32,
    /// Where the element after it begins in the stream.
    end: u32,
    /// Where its output begins.
    out: u32,
    /// The first output position it reads: `out` for a literal, `out - offset` for a
    /// back-reference.
    reach: u32,
    literal: bool,
}

/// The piece of a stream that produces `out_start..` of the output: the stream's bytes
/// `start..end`, of which the first `literal` are the rest of a literal.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub(super) struct Span {
    pub(super) start: u32,
    pub(super) end: u32,
    pub(super) literal: u32,
    pub(super) out_start: u32,
}

/// One element's tag: literal length, or back-reference length and offset, and where its
/// payload begins.
enum Tag {
    Literal {
        len: usize,
        body: usize,
    },
    Copy {
        len: usize,
        offset: usize,
        body: usize,
    },
}

fn tag_at(input: &[u8], pos: usize) -> Result<Tag, String> {
    let cut = || format!("the Snappy stream ends inside the element at byte {pos}");
    let tag = *input.get(pos).ok_or_else(cut)?;
    let le = |from: usize, n: usize| -> Result<usize, String> {
        let bytes = input.get(from..from + n).ok_or_else(cut)?;
        Ok(bytes
            .iter()
            .rev()
            .fold(0usize, |v, &b| (v << 8) | usize::from(b)))
    };
    Ok(match tag & 3 {
        0 => {
            let n = usize::from(tag >> 2);
            if n < 60 {
                Tag::Literal {
                    len: n + 1,
                    body: pos + 1,
                }
            } else {
                let extra = n - 59;
                Tag::Literal {
                    len: le(pos + 1, extra)? + 1,
                    body: pos + 1 + extra,
                }
            }
        }
        1 => Tag::Copy {
            len: 4 + usize::from((tag >> 2) & 7),
            offset: (usize::from(tag >> 5) << 8) | le(pos + 1, 1)?,
            body: pos + 2,
        },
        2 => Tag::Copy {
            len: 1 + usize::from(tag >> 2),
            offset: le(pos + 1, 2)?,
            body: pos + 3,
        },
        _ => Tag::Copy {
            len: 1 + usize::from(tag >> 2),
            offset: le(pos + 1, 4)?,
            body: pos + 5,
        },
    })
}

/// Appends `len` bytes copied from `offset` bytes back (overlapping copies repeat).
fn copy_back(out: &mut Vec<u8>, offset: usize, len: usize) -> Result<(), String> {
    if offset == 0 || offset > out.len() {
        return Err(format!(
            "a Snappy back-reference reaches {offset} bytes back from output byte {}",
            out.len()
        ));
    }
    let from = out.len() - offset;
    if offset >= len {
        out.extend_from_within(from..from + len);
    } else {
        for i in 0..len {
            out.push(out[from + i]);
        }
    }
    Ok(())
}

/// Lists the elements of a whole Snappy stream, and its output's length, without
/// decompressing it (the crate has: reading tags only costs little where a page is made of
/// long literals). Fails where the stream is not valid: a literal past its end, a
/// back-reference before the output's start, another length than it declares.
pub(super) fn elements(input: &[u8]) -> Result<(usize, Vec<Element>), String> {
    let (declared, mut pos) = preamble(input)?;
    let mut elements = Vec::new();
    let mut out = 0usize;
    let too_long = || "the Snappy stream is longer than 4 GiB".to_owned();
    while pos < input.len() {
        let (body, end, reach, literal, len) = match tag_at(input, pos)? {
            Tag::Literal { len, body } => {
                if body + len > input.len() {
                    return Err(format!(
                        "the Snappy stream ends inside the literal at byte {pos}"
                    ));
                }
                (body, body + len, out, true, len)
            }
            Tag::Copy { len, offset, body } => {
                if offset == 0 || offset > out {
                    return Err(format!(
                        "a Snappy back-reference reaches {offset} bytes back from output byte {out}"
                    ));
                }
                (body, body, out - offset, false, len)
            }
        };
        let u32_of = |v: usize| u32::try_from(v).map_err(|_| too_long());
        elements.push(Element {
            body: u32_of(body)?,
            end: u32_of(end)?,
            out: u32_of(out)?,
            reach: u32_of(reach)?,
            literal,
        });
        out += len;
        if out > declared {
            return Err(format!(
                "the Snappy stream holds more than the {declared} bytes it declares"
            ));
        }
        pos = end;
    }
    if out != declared {
        return Err(format!(
            "the Snappy stream holds {out} bytes, not the {declared} it declares"
        ));
    }
    Ok((out, elements))
}

/// The declared output length (a varint) and where the elements begin.
fn preamble(input: &[u8]) -> Result<(usize, usize), String> {
    let mut len = 0usize;
    for (i, &b) in input.iter().enumerate().take(5) {
        len |= usize::from(b & 0x7f) << (7 * i);
        if b & 0x80 == 0 {
            return Ok((len, i + 1));
        }
    }
    Err("the Snappy stream has no valid length".into())
}

/// The piece of the stream that `elements` describe which produces output bytes `a..b`
/// (`a < b`, within the output).
pub(super) fn span(elements: &[Element], a: u32, b: u32) -> Span {
    // The element holding the last byte, then back to the first element whose output the
    // piece needs, following back-references.
    let last = elements.partition_point(|e| e.out < b) - 1;
    let mut need = a;
    let mut i = last;
    loop {
        let e = &elements[i];
        if !e.literal {
            need = need.min(e.reach);
        }
        if e.out <= need || i == 0 {
            break;
        }
        i -= 1;
    }
    let first = &elements[i];
    // A piece begins inside a literal (a back-reference's source is always earlier output,
    // so the walk never stops on one unless the stream is the first element's).
    let skip = need.saturating_sub(first.out);
    let start = first.body + skip;
    let literal = if first.literal {
        first.end - first.body - skip
    } else {
        0
    };
    let l = &elements[last];
    let end = if l.literal {
        l.body + (b - l.out)
    } else {
        l.end
    };
    Span {
        start,
        end,
        literal,
        out_start: first.out + skip,
    }
}

/// Decompresses a piece of a stream (`input`, the stream's bytes `span.start..span.end`) up
/// to `want` bytes of output, which begin at the span's `out_start`.
pub(super) fn decode_span(input: &[u8], span: &Span, want: usize) -> Result<Vec<u8>, String> {
    let mut out = Vec::with_capacity(want);
    let lit = (span.literal as usize).min(want);
    out.extend_from_slice(
        input
            .get(..lit)
            .ok_or("the piece of the Snappy stream is shorter than its literal")?,
    );
    let mut pos = span.literal as usize;
    while out.len() < want {
        match tag_at(input, pos)? {
            Tag::Literal { len, body } => {
                let n = len.min(want - out.len());
                let bytes = input
                    .get(body..body + n)
                    .ok_or("the piece of the Snappy stream ends inside a literal")?;
                out.extend_from_slice(bytes);
                pos = body + len;
            }
            Tag::Copy { len, offset, body } => {
                copy_back(&mut out, offset, len)?;
                pos = body;
            }
        }
    }
    out.truncate(want);
    Ok(out)
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::{decode_span, elements, span};

    /// Data that compresses into both literals and back-references: random runs, repeats
    /// of earlier runs (near and far), and bytes repeated in place.
    fn mixed() -> impl Strategy<Value = Vec<u8>> {
        prop::collection::vec(
            (
                0u8..3,
                prop::collection::vec(any::<u8>(), 1..300),
                1usize..5000,
            ),
            1..40,
        )
        .prop_map(|parts| {
            let mut out: Vec<u8> = Vec::new();
            for (kind, bytes, back) in parts {
                match kind {
                    0 => out.extend_from_slice(&bytes),
                    1 if !out.is_empty() => {
                        let from = out.len().saturating_sub(back);
                        let n = bytes.len().min(out.len() - from);
                        out.extend_from_within(from..from + n);
                    }
                    _ => out.extend(std::iter::repeat_n(bytes[0], bytes.len())),
                }
            }
            out
        })
    }

    proptest! {
        #[test]
        fn every_range_decodes_alone_as_in_the_whole(data in mixed(), cuts in prop::collection::vec((any::<u32>(), any::<u32>()), 1..20)) {
            let compressed = snap::raw::Encoder::new().compress_vec(&data).unwrap();
            let (len, elements) = elements(&compressed).unwrap();
            prop_assert_eq!(len, data.len());
            let whole = span(&elements, 0, len as u32);
            let piece = &compressed[whole.start as usize..whole.end as usize];
            prop_assert_eq!(&decode_span(piece, &whole, len).unwrap(), &data);
            for (x, y) in cuts {
                let n = data.len() as u32;
                let (a, b) = (x % n, y % n + 1);
                let (a, b) = (a.min(b - 1), b.max(a + 1));
                let s = span(&elements, a, b);
                prop_assert!(s.out_start <= a);
                let piece = &compressed[s.start as usize..s.end as usize];
                let got = decode_span(piece, &s, (b - s.out_start) as usize).unwrap();
                prop_assert_eq!(&got[(a - s.out_start) as usize..], &data[a as usize..b as usize]);
            }
        }
    }

    #[test]
    fn incompressible_bytes_need_only_their_own_piece() {
        // 64 KiB of noise (one literal): a range's piece is the range itself.
        let mut state = 0x2545_f491_4f6c_dd1du64;
        let data: Vec<u8> = (0..65536)
            .map(|_| {
                state ^= state << 13;
                state ^= state >> 7;
                state ^= state << 17;
                state as u8
            })
            .collect();
        let compressed = snap::raw::Encoder::new().compress_vec(&data).unwrap();
        let (_, list) = elements(&compressed).unwrap();
        let s = span(&list, 30_000, 31_000);
        assert_eq!(s.end - s.start, 1000);
        assert_eq!(s.out_start, 30_000);
    }

    /// Fuzzed streams (valid ones with bytes overwritten): never a panic, and whatever
    /// `elements` accepts is what the `snap` crate decodes, range by range.
    #[test]
    fn fuzzed_streams_never_panic_and_agree_with_snap() {
        bolero::check!()
            .with_type::<(Vec<u8>, Vec<(u16, u8)>, u32, u32)>()
            .with_iterations(3_000)
            .for_each(|(data, edits, x, y)| {
                let mut stream = snap::raw::Encoder::new().compress_vec(data).unwrap();
                for &(at, v) in edits {
                    let n = stream.len();
                    stream[usize::from(at) % n] = v;
                }
                let Ok((len, list)) = elements(&stream) else {
                    return;
                };
                let whole = snap::raw::Decoder::new()
                    .decompress_vec(&stream)
                    .expect("a stream that elements() accepts decodes");
                assert_eq!(len, whole.len());
                if len == 0 {
                    return;
                }
                let n = len as u32;
                let (a, b) = (x % n, y % n + 1);
                let (a, b) = (a.min(b - 1), b.max(a + 1));
                let s = span(&list, a, b);
                let piece = &stream[s.start as usize..s.end as usize];
                let got = decode_span(piece, &s, (b - s.out_start) as usize).unwrap();
                assert_eq!(
                    &got[(a - s.out_start) as usize..],
                    &whole[a as usize..b as usize]
                );
            });
    }

    #[test]
    fn damaged_streams_are_errors_not_panics() {
        let compressed = snap::raw::Encoder::new()
            .compress_vec(&b"abcdabcdabcdabcdabcd xyz".repeat(20))
            .unwrap();
        for cut in 0..compressed.len() {
            assert!(elements(&compressed[..cut]).is_err(), "cut at {cut}");
        }
        // A back-reference before the output's start.
        assert!(elements(&[4, 0x01, 9]).is_err());
        let (_, list) = elements(&compressed).unwrap();
        let s = span(&list, 400, 480);
        let piece = &compressed[s.start as usize..s.end as usize];
        assert!(decode_span(&piece[..piece.len() / 2], &s, 480 - s.out_start as usize).is_err());
    }
}
