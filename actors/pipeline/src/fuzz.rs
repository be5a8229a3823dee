//! Fuzz target of JPEG and PNG decoding, the parsers that read the bytes of every element.
//! Under `cargo test` it runs a short bounded random search (bolero's test engine) as part of
//! the test command; for long runs on nightly, `cargo bolero test -p joader-pipeline
//! fuzz::<name>` drives the same target with libFuzzer. The property: any input gives a value
//! or an error, never a panic, and a value respects the limits.

use bolero::check;

use crate::{self as pipeline, Limits, Pipeline};

/// Inputs tried in the test command (a few seconds).
const ITERATIONS: usize = 2_000;

fn jpeg_seed() -> Vec<u8> {
    let (w, h) = (48u16, 32u16);
    let pixels: Vec<u8> = (0..usize::from(w) * usize::from(h) * 3)
        .map(|i| (i * 7 % 251) as u8)
        .collect();
    let mut out = Vec::new();
    jpeg_encoder::Encoder::new(&mut out, 90)
        .encode(&pixels, w, h, jpeg_encoder::ColorType::Rgb)
        .unwrap();
    out
}

fn png_seed() -> Vec<u8> {
    use zune_core::bit_depth::BitDepth;
    use zune_core::colorspace::ColorSpace;
    use zune_core::options::EncoderOptions;
    let (w, h) = (40usize, 24usize);
    let pixels: Vec<u8> = (0..w * h * 3).map(|i| (i * 13 % 253) as u8).collect();
    let options = EncoderOptions::new(w, h, ColorSpace::RGB, BitDepth::Eight);
    let mut out = Vec::new();
    zune_png::PngEncoder::new(&pixels, options)
        .encode(&mut out)
        .unwrap();
    out
}

#[test]
fn image_decoding_never_panics_and_respects_the_limits() {
    let seeds = [jpeg_seed(), png_seed()];
    let pipelines = [
        Pipeline::Decode {
            resize_shorter: None,
            center_crop: None,
        },
        Pipeline::Decode {
            resize_shorter: Some(16),
            center_crop: Some([16, 16]),
        },
    ];
    let limits = Limits {
        max_pixels: 1 << 20,
    };
    check!()
        .with_type::<(bool, Vec<(u16, u8)>, u16, bool)>()
        .with_iterations(ITERATIONS)
        .for_each(|(png, edits, cut, crop)| {
            let mut bytes = seeds[usize::from(*png)].clone();
            for &(at, v) in edits {
                let n = bytes.len();
                bytes[usize::from(at) % n] = v;
            }
            bytes.truncate(usize::from(*cut).max(1).min(bytes.len()));
            let p = &pipelines[usize::from(*crop)];
            match pipeline::run(p, &bytes, &limits) {
                Ok(pipeline::Output::Hwc {
                    data,
                    height,
                    width,
                    channels,
                }) => {
                    assert_eq!(channels, 3);
                    assert!(u64::from(height) * u64::from(width) <= limits.max_pixels);
                    assert_eq!(data.len(), (height * width * channels) as usize);
                    if *crop {
                        assert_eq!((height, width), (16, 16));
                    }
                }
                Ok(pipeline::Output::Raw(_)) => panic!("a decode pipeline returned raw bytes"),
                Err(_) => {}
            }
        });
}
