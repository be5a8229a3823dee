//! Tests of the shared pipeline on generated JPEGs, PNGs and WebPs (the comparison of the DCT-scaled
//! path with the full one on real photos is in the integration tests, `tests/it/decode.rs`).

use jpeg_encoder::{ColorType, Encoder, SamplingFactor};
use zune_core::bit_depth::BitDepth;
use zune_core::colorspace::ColorSpace;
use zune_core::options::EncoderOptions;
use zune_png::PngEncoder;

use super::*;

/// A smooth test picture with some detail, `channels` interleaved bytes per pixel.
fn pattern(width: u32, height: u32, channels: usize) -> Vec<u8> {
    let mut out = Vec::with_capacity(width as usize * height as usize * channels);
    for y in 0..height {
        for x in 0..width {
            let r = (x * 255 / width.max(1)) as u8;
            let g = (y * 255 / height.max(1)) as u8;
            let b = ((x / 8 + y / 8) % 2 * 120 + 60) as u8;
            let px = [r, g, b, 255 - r / 2];
            out.extend_from_slice(&px[..channels.min(4)]);
        }
    }
    out
}

fn jpeg(data: &[u8], width: u32, height: u32, color: ColorType, quality: u8) -> Vec<u8> {
    let mut out = Vec::new();
    let mut enc = Encoder::new(&mut out, quality);
    enc.set_sampling_factor(SamplingFactor::F_2_2);
    enc.encode(data, width as u16, height as u16, color)
        .unwrap();
    out
}

fn jpeg_rgb(width: u32, height: u32) -> Vec<u8> {
    jpeg(
        &pattern(width, height, 3),
        width,
        height,
        ColorType::Rgb,
        95,
    )
}

fn png(data: &[u8], width: u32, height: u32, colorspace: ColorSpace) -> Vec<u8> {
    let options = EncoderOptions::new(width as usize, height as usize, colorspace, BitDepth::Eight);
    let mut out = Vec::new();
    PngEncoder::new(data, options).encode(&mut out).unwrap();
    out
}

fn decode(resize_shorter: Option<u32>, center_crop: Option<[u32; 2]>) -> Pipeline {
    Pipeline::Decode {
        resize_shorter,
        center_crop,
    }
}

/// Runs and unpacks an `Hwc` output as (data, height, width).
fn hwc(p: &Pipeline, bytes: &[u8]) -> (Vec<u8>, u32, u32) {
    match run(p, bytes, &Limits::default()).unwrap() {
        Output::Hwc {
            data,
            height,
            width,
            channels,
        } => {
            assert_eq!(channels, 3);
            assert_eq!(data.len(), height as usize * width as usize * 3);
            (data, height, width)
        }
        Output::Raw(_) => panic!("decode pipeline returned raw bytes"),
    }
}

fn mean_abs_diff(a: &[u8], b: &[u8]) -> f64 {
    assert_eq!(a.len(), b.len());
    let sum: u64 = a
        .iter()
        .zip(b)
        .map(|(x, y)| u64::from(x.abs_diff(*y)))
        .sum();
    sum as f64 / a.len() as f64
}

#[test]
fn raw_returns_the_bytes() {
    let bytes = b"not even an image".to_vec();
    assert_eq!(
        run(&Pipeline::Raw, &bytes, &Limits::default()).unwrap(),
        Output::Raw(bytes.clone())
    );
}

#[test]
fn jpeg_round_trip_keeps_size_and_pixels() {
    let (w, h) = (64, 48);
    let (data, height, width) = hwc(&decode(None, None), &jpeg_rgb(w, h));
    assert_eq!((height, width), (h, w));
    let err = mean_abs_diff(&data, &pattern(w, h, 3));
    assert!(err < 6.0, "mean abs error {err}");
}

#[test]
fn png_round_trip_is_exact() {
    let (w, h) = (37, 21);
    let src = pattern(w, h, 3);
    let (data, height, width) = hwc(&decode(None, None), &png(&src, w, h, ColorSpace::RGB));
    assert_eq!((height, width), (h, w));
    assert_eq!(data, src);
}

#[test]
fn png_alpha_is_dropped_and_gray_replicated() {
    let (w, h) = (20, 10);
    let rgba = pattern(w, h, 4);
    let (data, _, _) = hwc(&decode(None, None), &png(&rgba, w, h, ColorSpace::RGBA));
    let expected: Vec<u8> = rgba.chunks(4).flat_map(|p| [p[0], p[1], p[2]]).collect();
    assert_eq!(data, expected);

    let gray = pattern(w, h, 1);
    let (data, _, _) = hwc(&decode(None, None), &png(&gray, w, h, ColorSpace::Luma));
    let expected: Vec<u8> = gray.iter().flat_map(|g| [*g; 3]).collect();
    assert_eq!(data, expected);

    let gray_alpha: Vec<u8> = gray.iter().flat_map(|g| [*g, 7]).collect();
    let (data, _, _) = hwc(
        &decode(None, None),
        &png(&gray_alpha, w, h, ColorSpace::LumaA),
    );
    assert_eq!(data, expected);
}

#[test]
fn grayscale_and_cmyk_jpegs_become_rgb() {
    let (w, h) = (32, 24);
    let gray = pattern(w, h, 1);
    let (data, height, width) = hwc(&decode(None, None), &jpeg(&gray, w, h, ColorType::Luma, 95));
    assert_eq!((height, width), (h, w));
    assert!(data.chunks(3).all(|p| p[0] == p[1] && p[1] == p[2]));
    let err = mean_abs_diff(&data.chunks(3).map(|p| p[0]).collect::<Vec<_>>(), &gray);
    assert!(err < 4.0, "mean abs error {err}");

    let cmyk = pattern(w, h, 4);
    let (_, height, width) = hwc(&decode(None, None), &jpeg(&cmyk, w, h, ColorType::Cmyk, 95));
    assert_eq!((height, width), (h, w));
}

#[test]
fn resize_keeps_aspect_ratio_and_rounds() {
    let landscape = jpeg_rgb(500, 375);
    let (_, h, w) = hwc(&decode(Some(256), None), &landscape);
    // 500 * 256 / 375 = 341.33
    assert_eq!((h, w), (256, 341));

    let portrait = jpeg_rgb(375, 500);
    let (_, h, w) = hwc(&decode(Some(256), None), &portrait);
    assert_eq!((h, w), (341, 256));
    // The stored size is kept beside the output (DCT-scaled or not): boxes are scaled from it.
    for (eighths, img) in [(DCT_EIGHTHS, &landscape), (&[][..], &portrait)] {
        let d = decode_with_scales(&decode(Some(256), None), img, &Limits::default(), eighths)
            .unwrap()
            .unwrap();
        let want = if std::ptr::eq(img, &landscape) {
            (375, 500)
        } else {
            (500, 375)
        };
        assert_eq!(d.source_size(), want);
    }

    // 100 * 64 / 30 = 213.33; 101 * 64 / 30 = 215.47 -> 215; 10 * 64 / 30 = 21.33 (upscale)
    assert_eq!(resize::resized_size(100, 30, 64), (213, 64));
    assert_eq!(resize::resized_size(30, 101, 64), (64, 215));
    assert_eq!(resize::resized_size(10, 30, 64), (64, 192));
    assert_eq!(resize::resized_size(3000, 1, 1), (3000, 1));
    assert_eq!(resize::resized_size(1, 3000, 2), (2, 6000));
}

#[test]
fn center_crop_gives_exact_size() {
    let img = jpeg_rgb(500, 375);
    let (_, h, w) = hwc(&decode(Some(256), Some([224, 224])), &img);
    assert_eq!((h, w), (224, 224));
    let (_, h, w) = hwc(&decode(Some(256), Some([200, 300])), &img);
    assert_eq!((h, w), (200, 300));
}

#[test]
fn crop_without_resize_cuts_the_center() {
    let (w, h) = (40, 30);
    let src = pattern(w, h, 3);
    let (data, ch, cw) = hwc(
        &decode(None, Some([10, 20])),
        &png(&src, w, h, ColorSpace::RGB),
    );
    assert_eq!((ch, cw), (10, 20));
    let mut expected = Vec::new();
    for y in 10..20 {
        let row = (y * w as usize + 10) * 3;
        expected.extend_from_slice(&src[row..row + 60]);
    }
    assert_eq!(data, expected);
}

#[test]
fn fused_crop_equals_resize_then_crop() {
    for (w, h, target, crop) in [
        (500u32, 375u32, 256u32, [224u32, 224u32]),
        (375, 500, 256, [224, 224]),
        (333, 517, 100, [90, 61]),
        (64, 48, 96, [80, 100]),
    ] {
        let bytes = png(&pattern(w, h, 3), w, h, ColorSpace::RGB);
        let (full, fh, fw) = hwc(&decode(Some(target), None), &bytes);
        let (cut, ch, cw) = hwc(&decode(Some(target), Some(crop)), &bytes);
        assert_eq!([ch, cw], crop);
        let (x0, y0) = ((fw - cw) / 2, (fh - ch) / 2);
        let mut expected = Vec::new();
        for y in y0..y0 + ch {
            let row = (y * fw + x0) as usize * 3;
            expected.extend_from_slice(&full[row..row + cw as usize * 3]);
        }
        assert_eq!(cut, expected, "{w}x{h} r{target} c{crop:?}");
    }
}

#[test]
fn resize_of_a_flat_image_stays_flat_and_downscale_averages() {
    let (w, h) = (90, 60);
    let flat: Vec<u8> = [200u8, 100, 50].repeat((w * h) as usize);
    let (data, _, _) = hwc(&decode(Some(17), None), &png(&flat, w, h, ColorSpace::RGB));
    assert!(data.chunks(3).all(|p| p == [200, 100, 50]));

    // A fine checkerboard of 0 and 250 shrunk 10x averages to about 125 everywhere
    // (antialiased filter, not a point sample).
    let checker: Vec<u8> = (0..w * h)
        .flat_map(|i| {
            let (x, y) = (i % w, i / w);
            [if (x + y) % 2 == 0 { 0 } else { 250 }; 3]
        })
        .collect();
    let (data, _, _) = hwc(
        &decode(Some(6), None),
        &png(&checker, w, h, ColorSpace::RGB),
    );
    assert!(data.iter().all(|v| (115..=135).contains(v)), "{data:?}");
}

#[test]
fn crop_larger_than_image_is_an_error() {
    let img = jpeg_rgb(64, 48);
    let err = run(&decode(None, Some([50, 50])), &img, &Limits::default()).unwrap_err();
    assert_eq!(err.code(), "crop_too_large");
    let err = run(&decode(Some(32), Some([32, 50])), &img, &Limits::default()).unwrap_err();
    assert_eq!(
        err,
        PipelineError::CropTooLarge {
            crop_height: 32,
            crop_width: 50,
            height: 32,
            width: 43
        }
    );
}

/// The first `keep` bytes of `img` decode to a `corrupt_image` error.
fn assert_truncation_is_corrupt(img: &[u8], keep: usize) {
    let err = run(&decode(None, None), &img[..keep], &Limits::default()).unwrap_err();
    assert_eq!(err.code(), "corrupt_image", "{keep} bytes: {err}");
    assert!(matches!(err, PipelineError::Corrupt(_)), "{err}");
}

#[test]
fn truncated_jpeg_is_corrupt() {
    let img = jpeg_rgb(64, 48);
    for keep in [img.len() / 2, img.len() - 10, 200] {
        assert_truncation_is_corrupt(&img, keep);
    }
    let err = run(&decode(None, None), &img[..3], &Limits::default()).unwrap_err();
    assert_eq!(err.code(), "corrupt_image");
}

fn webp_lossless(data: &[u8], width: u32, height: u32, color: image_webp::ColorType) -> Vec<u8> {
    let mut out = Vec::new();
    image_webp::WebPEncoder::new(&mut out)
        .encode(data, width, height, color)
        .unwrap();
    out
}

#[test]
fn webp_lossless_round_trip_is_exact_and_alpha_dropped() {
    let (w, h) = (37, 21);
    let src = pattern(w, h, 3);
    let img = webp_lossless(&src, w, h, image_webp::ColorType::Rgb8);
    let (data, height, width) = hwc(&decode(None, None), &img);
    assert_eq!((height, width), (h, w));
    assert_eq!(data, src);
    assert_eq!(dimensions(&img).unwrap(), (w, h));

    let rgba = pattern(w, h, 4);
    let img = webp_lossless(&rgba, w, h, image_webp::ColorType::Rgba8);
    let (data, _, _) = hwc(&decode(None, None), &img);
    let expected: Vec<u8> = rgba.chunks(4).flat_map(|p| [p[0], p[1], p[2]]).collect();
    assert_eq!(data, expected);
}

#[test]
fn truncated_webp_is_corrupt_and_its_pixels_are_limited() {
    let (w, h) = (64, 48);
    let img = webp_lossless(&pattern(w, h, 3), w, h, image_webp::ColorType::Rgb8);
    assert_truncation_is_corrupt(&img, img.len() / 2);
    let err = run(&decode(None, None), &img, &Limits { max_pixels: 100 }).unwrap_err();
    assert!(matches!(err, PipelineError::TooLarge { .. }), "{err}");
}

#[test]
fn truncated_png_is_corrupt() {
    let (w, h) = (64, 48);
    let img = png(&pattern(w, h, 3), w, h, ColorSpace::RGB);
    assert_truncation_is_corrupt(&img, img.len() / 2);
}

#[test]
fn random_bytes_are_not_an_image() {
    let mut x = 0x9E37_79B9_7F4A_7C15u64;
    let bytes: Vec<u8> = (0..4096)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect();
    for input in [&bytes[..], b"", b"\xff"] {
        let err = run(&decode(Some(10), None), input, &Limits::default()).unwrap_err();
        assert_eq!(err, PipelineError::NotAnImage);
        assert_eq!(err.code(), "not_an_image");
    }
    let err = run(
        &decode(None, None),
        b"GIF89a\x01\x00\x01\x00",
        &Limits::default(),
    )
    .unwrap_err();
    assert_eq!(err.code(), "unsupported_image");
}

/// Rewrites the frame size in a baseline JPEG's SOF0 header.
fn patch_jpeg_size(bytes: &mut [u8], width: u16, height: u16) {
    let sof = bytes
        .windows(2)
        .position(|w| w == [0xFF, 0xC0])
        .expect("baseline jpeg has an sof0 marker");
    bytes[sof + 5..sof + 7].copy_from_slice(&height.to_be_bytes());
    bytes[sof + 7..sof + 9].copy_from_slice(&width.to_be_bytes());
}

#[test]
fn too_large_is_refused_from_the_header() {
    let img = jpeg_rgb(100, 80);
    let small = Limits { max_pixels: 7_999 };
    let err = run(&decode(None, None), &img, &small).unwrap_err();
    assert_eq!(
        err,
        PipelineError::TooLarge {
            width: 100,
            height: 80,
            max_pixels: 7_999
        }
    );
    assert_eq!(err.code(), "image_too_large");
    assert!(run(&decode(None, None), &img, &Limits { max_pixels: 8_000 }).is_ok());

    // A header claiming 60000x60000 followed by far too little data: decoding would fail as
    // corrupt, so `TooLarge` proves the check happens before decoding.
    let mut huge = img.clone();
    patch_jpeg_size(&mut huge, 60_000, 60_000);
    let err = run(&decode(Some(224), None), &huge, &Limits::default()).unwrap_err();
    assert_eq!(err.code(), "image_too_large", "{err}");

    // Same for PNG.
    let (w, h) = (50, 40);
    let p = png(&pattern(w, h, 3), w, h, ColorSpace::RGB);
    let err = run(&decode(None, None), &p, &Limits { max_pixels: 1_999 }).unwrap_err();
    assert_eq!(err.code(), "image_too_large");

    // The output of an upscale counts as well.
    let err = run(
        &decode(Some(1000), None),
        &p,
        &Limits {
            max_pixels: 1_000_000,
        },
    )
    .unwrap_err();
    assert_eq!(
        err,
        PipelineError::TooLarge {
            width: 1250,
            height: 1000,
            max_pixels: 1_000_000
        }
    );
}

#[test]
fn same_bytes_give_same_pixels() {
    let img = jpeg_rgb(500, 375);
    let p = decode(Some(256), Some([224, 224]));
    let a = run(&p, &img, &Limits::default()).unwrap();
    let b = run(&p, &img, &Limits::default()).unwrap();
    assert_eq!(a, b);
    let c = std::thread::spawn(move || run(&p, &img, &Limits::default()).unwrap())
        .join()
        .unwrap();
    assert_eq!(a, c);
}

#[test]
fn validate_checks_sizes() {
    assert!(Pipeline::Raw.validate().is_ok());
    assert!(decode(None, None).validate().is_ok());
    assert!(decode(Some(256), Some([224, 224])).validate().is_ok());
    assert!(decode(Some(256), Some([300, 224])).validate().is_ok());
    assert!(decode(Some(MAX_SIDE), None).validate().is_ok());
    for bad in [
        decode(Some(0), None),
        decode(Some(MAX_SIDE + 1), None),
        decode(None, Some([0, 10])),
        decode(None, Some([10, MAX_SIDE + 1])),
        decode(Some(256), Some([300, 300])),
    ] {
        let err = bad.validate().unwrap_err();
        assert_eq!(err.code(), "bad_pipeline", "{bad:?}");
        let err = run(&bad, &jpeg_rgb(8, 8), &Limits::default()).unwrap_err();
        assert_eq!(err.code(), "bad_pipeline");
    }
}

#[test]
fn keys_are_short_and_distinct() {
    assert_eq!(Pipeline::Raw.key(), "raw");
    assert_eq!(decode(None, None).key(), "decode");
    assert_eq!(decode(Some(256), None).key(), "decode-r256");
    assert_eq!(decode(None, Some([224, 200])).key(), "decode-c224x200");
    assert_eq!(
        decode(Some(256), Some([224, 224])).key(),
        "decode-r256-c224x224"
    );
}

#[test]
fn serde_form() {
    let p: Pipeline = serde_json::from_str(r#"{"kind":"raw"}"#).unwrap();
    assert_eq!(p, Pipeline::Raw);
    let p: Pipeline = serde_json::from_str(r#"{"kind":"decode"}"#).unwrap();
    assert_eq!(p, decode(None, None));
    let p: Pipeline =
        serde_json::from_str(r#"{"kind":"decode","resize_shorter":256,"center_crop":[224,200]}"#)
            .unwrap();
    assert_eq!(p, decode(Some(256), Some([224, 200])));
    let back: Pipeline = serde_json::from_str(&serde_json::to_string(&p).unwrap()).unwrap();
    assert_eq!(back, p);
    for bad in [
        r#"{"kind":"decode","resize":256}"#,
        r#"{"kind":"raw","x":1}"#,
        r#"{"kind":"raw","resize_shorter":1}"#,
        r#"{"kind":"decode","resize_shorter":-1}"#,
        r#"{"kind":"blur"}"#,
        r#"{"resize_shorter":256}"#,
        r#"{"kind":"decode","center_crop":[224]}"#,
    ] {
        assert!(serde_json::from_str::<Pipeline>(bad).is_err(), "{bad}");
    }
}

#[test]
fn progressive_jpeg_and_16_bit_png_decode() {
    let (w, h) = (72, 40);
    let src = pattern(w, h, 3);
    let mut prog = Vec::new();
    let mut enc = Encoder::new(&mut prog, 95);
    enc.set_progressive(true);
    enc.encode(&src, w as u16, h as u16, ColorType::Rgb)
        .unwrap();
    let (data, height, width) = hwc(&decode(None, None), &prog);
    assert_eq!((height, width), (h, w));
    assert!(mean_abs_diff(&data, &src) < 6.0);
    // A progressive file cut short is corrupt too.
    let err = run(
        &decode(None, None),
        &prog[..prog.len() / 2],
        &Limits::default(),
    )
    .unwrap_err();
    assert_eq!(err.code(), "corrupt_image", "{err}");

    // 16-bit samples (big endian in the file) keep their high byte.
    let wide: Vec<u8> = src.iter().flat_map(|v| [*v, 0x5A]).collect();
    let options = EncoderOptions::new(w as usize, h as usize, ColorSpace::RGB, BitDepth::Sixteen);
    let mut file = Vec::new();
    PngEncoder::new(&wide, options).encode(&mut file).unwrap();
    let (data, _, _) = hwc(&decode(None, None), &file);
    assert_eq!(data, src);
}

/// A picture with detail at every scale (so that a wrong scale or offset shows): smooth
/// gradients plus rings and a fine checker.
fn detailed(width: u32, height: u32, channels: usize) -> Vec<u8> {
    let mut out = Vec::with_capacity(width as usize * height as usize * channels);
    let (cx, cy) = (f64::from(width) / 2.0, f64::from(height) / 2.0);
    for y in 0..height {
        for x in 0..width {
            let d = ((f64::from(x) - cx).powi(2) + (f64::from(y) - cy).powi(2)).sqrt();
            let ring = ((d / 40.0).sin() * 60.0 + 128.0) as u8;
            let r = (x * 200 / width.max(1)) as u8 + ring / 8;
            let g = ring;
            let b = ((x / 64 + y / 64) % 2 * 100 + 50) as u8;
            let px = [r, g, b, 255 - g];
            out.extend_from_slice(&px[..channels.min(4)]);
        }
    }
    out
}

const R256_C224: Pipeline = Pipeline::Decode {
    resize_shorter: Some(256),
    center_crop: Some([224, 224]),
};

fn scaled_and_full(p: &Pipeline, bytes: &[u8]) -> (Output, Output) {
    let limits = Limits::default();
    (
        run(p, bytes, &limits).unwrap(),
        run_full_decode(p, bytes, &limits).unwrap(),
    )
}

fn pixels(o: &Output) -> (&[u8], u32, u32) {
    match o {
        Output::Hwc {
            data,
            height,
            width,
            ..
        } => (data, *height, *width),
        Output::Raw(_) => panic!("raw output"),
    }
}

#[test]
fn dct_scaled_decode_matches_the_full_path() {
    // 1/2, 1/4 (1600 / 8 < 256) and 1/8, landscape and portrait, sides not multiples of 8.
    for (w, h, crop) in [
        (1000u32, 750u32, Some([224u32, 224u32])),
        (2100, 1601, Some([224, 224])),
        (3001, 4003, None),
        (2050, 3000, Some([256, 200])),
    ] {
        let bytes = jpeg(&detailed(w, h, 3), w, h, ColorType::Rgb, 90);
        let p = decode(Some(256), crop);
        let (scaled, full) = scaled_and_full(&p, &bytes);
        let (a, ah, aw) = pixels(&scaled);
        let (b, bh, bw) = pixels(&full);
        assert_eq!((ah, aw), (bh, bw), "{w}x{h}");
        let mad = mean_abs_diff(a, b);
        assert!(mad <= 2.0, "{w}x{h}: mean abs difference {mad}");
        // Not trivially equal: the scaled path really ran (libjpeg's IDCT differs).
        assert_ne!(a, b, "{w}x{h}: the scaled path gave the full path's bytes");
    }
}

/// Every M/8 that libjpeg decodes at, the default's and the others.
const EVERY_EIGHTH: &[u32] = &[1, 2, 3, 4, 5, 6, 7];

#[test]
fn a_scaled_decode_is_exactly_side_times_m_over_8_rounded_up() {
    // libjpeg's `jdiv_round_up(side * M, 8)`: 500 -> 438 and 375 -> 329 at 7/8.
    for (w, h) in [
        (500u32, 375u32),
        (8, 8),
        (9, 15),
        (31, 17),
        (1001, 333),
        (333, 1001),
    ] {
        for color in [ColorType::Rgb, ColorType::Luma] {
            let channels = if color == ColorType::Luma { 1 } else { 3 };
            for sampling in [SamplingFactor::F_2_2, SamplingFactor::F_1_1] {
                let mut bytes = Vec::new();
                let mut enc = Encoder::new(&mut bytes, 90);
                enc.set_sampling_factor(sampling);
                enc.encode(&detailed(w, h, channels), w as u16, h as u16, color)
                    .unwrap();
                for &m in EVERY_EIGHTH {
                    let img = scaled::decode(&bytes, (w, h), m).unwrap();
                    let expected = ((w * m).div_ceil(8), (h * m).div_ceil(8));
                    assert_eq!(
                        (img.width, img.height),
                        expected,
                        "{w}x{h} {color:?} {sampling:?} at {m}/8"
                    );
                    assert_eq!(img.eighths, m);
                    assert_eq!(img.data.len(), (expected.0 * expected.1 * 3) as usize);
                }
            }
        }
    }
}

#[test]
fn seven_eighths_matches_the_full_path() {
    // Shorter sides from 365 to 638 decode at 7/8 for a 256 target when it is allowed; sides
    // not multiples of 8, landscape and portrait, crops at fractional source offsets.
    for (w, h, crop) in [
        (500u32, 375u32, Some([224u32, 224u32])),
        (600, 450, Some([224, 224])),
        (637, 851, None),
        (853, 638, Some([256, 200])),
        (367, 541, Some([200, 256])),
    ] {
        let bytes = jpeg(&detailed(w, h, 3), w, h, ColorType::Rgb, 90);
        let p = decode(Some(256), crop);
        let limits = Limits::default();
        let seven = run_with_scales(&p, &bytes, &limits, &[7]).unwrap();
        let full = run_full_decode(&p, &bytes, &limits).unwrap();
        let (a, ah, aw) = pixels(&seven);
        let (b, bh, bw) = pixels(&full);
        assert_eq!((ah, aw), (bh, bw), "{w}x{h}");
        let mad = mean_abs_diff(a, b);
        assert!(mad <= 2.0, "{w}x{h}: mean abs difference {mad}");
        // The scaled path really ran.
        assert_ne!(a, b, "{w}x{h}: 7/8 gave the full path's bytes");
        // Beside 1/8, 1/4 and 1/2, 7/8 is taken only where a half does not cover.
        assert_eq!(
            run_with_scales(&p, &bytes, &limits, &[1, 2, 4, 7]).unwrap(),
            seven,
            "{w}x{h}"
        );
    }
}

proptest::proptest! {
    /// Whatever the size, target and crop, every scale gives the full path's output size, never
    /// a crop box outside the decoded image (a side is ⌈stored × M / 8⌉, and the box ends at
    /// stored × M / 8 up to rounding).
    #[test]
    fn every_scale_keeps_the_geometry_of_the_full_path(
        w in 1u32..260,
        h in 1u32..260,
        target in 1u32..140,
        crop in proptest::option::of((1u32..140, 1u32..140)),
        m in 1u32..8,
    ) {
        let bytes = jpeg(&pattern(w, h, 3), w, h, ColorType::Rgb, 80);
        let crop = crop.map(|(ch, cw)| [ch.min(target), cw.min(target)]);
        let p = decode(Some(target), crop);
        let limits = Limits::default();
        let full = run_full_decode(&p, &bytes, &limits);
        let scaled = run_with_scales(&p, &bytes, &limits, &[m]);
        match (&full, &scaled) {
            (Ok(f), Ok(s)) => {
                let (_, fh, fw) = pixels(f);
                let (_, sh, sw) = pixels(s);
                proptest::prop_assert_eq!((fh, fw), (sh, sw));
            }
            (Err(f), Err(s)) => proptest::prop_assert_eq!(f, s),
            _ => proptest::prop_assert!(false, "full {:?}, at {}/8 {:?}", full, m, scaled),
        }
    }
}

#[test]
fn small_images_and_upscales_use_the_full_path() {
    // 500x375 to 256: no DCT scale covers it, so both paths are the same decoder.
    let bytes = jpeg(&detailed(500, 375, 3), 500, 375, ColorType::Rgb, 90);
    let (scaled, full) = scaled_and_full(&R256_C224, &bytes);
    assert_eq!(scaled, full);
    let (scaled, full) = scaled_and_full(&decode(Some(600), None), &bytes);
    assert_eq!(scaled, full);
}

#[test]
fn grayscale_and_progressive_jpegs_scale() {
    let (w, h) = (1200, 900);
    let gray = jpeg(&detailed(w, h, 1), w, h, ColorType::Luma, 90);
    let (scaled, full) = scaled_and_full(&R256_C224, &gray);
    let (a, _, _) = pixels(&scaled);
    assert!(a.chunks(3).all(|p| p[0] == p[1] && p[1] == p[2]));
    assert!(mean_abs_diff(a, pixels(&full).0) <= 2.0);

    let mut prog = Vec::new();
    let mut enc = Encoder::new(&mut prog, 90);
    enc.set_progressive(true);
    enc.encode(&detailed(w, h, 3), w as u16, h as u16, ColorType::Rgb)
        .unwrap();
    let (scaled, full) = scaled_and_full(&R256_C224, &prog);
    let mad = mean_abs_diff(pixels(&scaled).0, pixels(&full).0);
    assert!(mad <= 2.0, "progressive: {mad}");
    let err = run(&R256_C224, &prog[..prog.len() * 2 / 3], &Limits::default()).unwrap_err();
    assert_eq!(err.code(), "corrupt_image", "{err}");
}

#[test]
fn cmyk_and_ycck_jpegs_are_decoded_at_full_size_then_shrunk() {
    let (w, h) = (800, 600);
    let cmyk = detailed(w, h, 4);
    for color in [ColorType::Cmyk, ColorType::CmykAsYcck] {
        let bytes = jpeg(&cmyk, w, h, color, 95);
        let (scaled, full) = scaled_and_full(&R256_C224, &bytes);
        assert_eq!(scaled, full, "{color:?}");
        let (a, ah, aw) = pixels(&scaled);
        assert_eq!((ah, aw), (224, 224));
        // Not a flat fill: the picture's detail survives.
        assert!(
            a.iter().max().unwrap() - a.iter().min().unwrap() > 60,
            "{color:?}"
        );
    }
}

#[test]
fn truncated_jpegs_are_corrupt_on_the_scaled_path_too() {
    let (w, h) = (1600, 1200);
    let img = jpeg(&detailed(w, h, 3), w, h, ColorType::Rgb, 90);
    for keep in [img.len() / 3, img.len() - 2, img.len() - 200] {
        let err = run(&R256_C224, &img[..keep], &Limits::default()).unwrap_err();
        assert_eq!(err.code(), "corrupt_image", "{keep} bytes: {err}");
    }
    // Bytes after the end marker are ignored, as cameras append data there.
    let mut tail = img.clone();
    tail.extend_from_slice(b"trailing junk");
    assert_eq!(
        run(&R256_C224, &tail, &Limits::default()),
        run(&R256_C224, &img, &Limits::default())
    );
}

/// An EXIF APP1 payload holding one IFD0 entry: orientation (tag 0x0112) = `value`.
fn exif_orientation(value: u16) -> Vec<u8> {
    let mut e = b"Exif\0\0II*\0".to_vec();
    e.extend_from_slice(&8u32.to_le_bytes()); // IFD0 offset
    e.extend_from_slice(&1u16.to_le_bytes()); // one entry
    e.extend_from_slice(&0x0112u16.to_le_bytes());
    e.extend_from_slice(&3u16.to_le_bytes()); // SHORT
    e.extend_from_slice(&1u32.to_le_bytes());
    e.extend_from_slice(&u32::from(value).to_le_bytes());
    e.extend_from_slice(&0u32.to_le_bytes()); // no next IFD
    e
}

#[test]
fn exif_orientation_is_not_applied() {
    // Orientation 6 asks viewers to rotate by 90 degrees; pixels still come in stored order,
    // as torchvision's decode_jpeg gives them by default.
    for (w, h) in [(300u32, 200u32), (1200, 800)] {
        let src = detailed(w, h, 3);
        let mut tagged = Vec::new();
        let mut enc = Encoder::new(&mut tagged, 90);
        enc.set_sampling_factor(SamplingFactor::F_2_2);
        enc.add_app_segment(1, exif_orientation(6)).unwrap();
        enc.encode(&src, w as u16, h as u16, ColorType::Rgb)
            .unwrap();
        let plain = jpeg(&src, w, h, ColorType::Rgb, 90);
        assert_ne!(tagged, plain);
        for p in [decode(None, None), R256_C224] {
            assert_eq!(
                run(&p, &tagged, &Limits::default()).unwrap(),
                run(&p, &plain, &Limits::default()).unwrap(),
                "{w}x{h} {p:?}"
            );
        }
        let (_, height, width) = hwc(&decode(None, None), &tagged);
        assert_eq!((width, height), (w, h));
    }
}

#[test]
fn dimensions_come_from_the_header() {
    assert_eq!(dimensions(&jpeg_rgb(64, 48)).unwrap(), (64, 48));
    let p = png(&pattern(5, 7, 3), 5, 7, ColorSpace::RGB);
    assert_eq!(dimensions(&p).unwrap(), (5, 7));
    assert_eq!(dimensions(b"nope").unwrap_err().code(), "not_an_image");
}

#[test]
fn run_charges_decode_and_resize_apart() {
    use crate::stage::{DECODE, RESIZE};
    use joader_stages as stages;
    let bytes = jpeg_rgb(1000, 750);
    let p = decode(Some(256), Some([224, 224]));
    let (decode_ns, resize_ns, used) = std::thread::spawn(move || {
        stages::flush();
        let before = (DECODE.nanos(), RESIZE.nanos(), stages::thread_cpu_ns());
        for _ in 0..20 {
            run(&p, &bytes, &Limits::default()).unwrap();
        }
        (
            DECODE.nanos() - before.0,
            RESIZE.nanos() - before.1,
            stages::thread_cpu_ns() - before.2,
        )
    })
    .join()
    .unwrap();
    assert!(decode_ns > 0 && resize_ns > 0);
    // Other tests of this binary may decode at the same time (the counters are per process),
    // so only what this thread used is a lower bound.
    assert!(
        decode_ns + resize_ns >= used * 9 / 10,
        "{decode_ns} + {resize_ns} of {used}"
    );
}

/// `decode` then `resize_into` (what the server's loader threads run to write an element
/// straight into its slot) gives the bytes and shape of `run`, for every kind of output: a
/// resize (DCT-scaled or not), a resize + crop, a crop alone, the image as it is; and a
/// destination of the wrong size is an error, not a panic.
#[test]
fn decode_then_resize_into_equals_run() {
    let limits = Limits::default();
    let cases = [
        (jpeg_rgb(640, 480), decode(Some(256), None)),
        (jpeg_rgb(640, 480), decode(Some(64), None)),
        (jpeg_rgb(640, 480), decode(Some(256), Some([224, 224]))),
        (jpeg_rgb(300, 200), decode(None, Some([100, 120]))),
        (jpeg_rgb(300, 200), decode(None, None)),
    ];
    for (bytes, p) in &cases {
        let (want, h, w) = hwc(p, bytes);
        let d = crate::decode(p, bytes, &limits)
            .unwrap()
            .expect("a decode pipeline");
        assert_eq!(d.shape(), (h, w, 3), "{p:?}");
        assert_eq!(d.len(), want.len(), "{p:?}");
        let mut dst = vec![7u8; d.len()];
        d.resize_into(&mut dst).unwrap();
        assert_eq!(dst, want, "{p:?}");
        let mut short = vec![0u8; d.len() - 1];
        assert!(d.resize_into(&mut short).is_err(), "{p:?}");
    }
    assert!(
        crate::decode(&Pipeline::Raw, b"abc", &limits)
            .unwrap()
            .is_none()
    );
}
