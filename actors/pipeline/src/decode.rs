//! Format sniffing and decoding of JPEG, PNG and WebP to RGB8, with the pixel limit checked on the
//! header before any pixel is decoded.

use image_webp::WebPDecoder;
use zune_core::bit_depth::BitDepth;
use zune_core::bytestream::ZCursor;
use zune_core::colorspace::ColorSpace;
use zune_core::options::DecoderOptions;
use zune_jpeg::JpegDecoder;
use zune_jpeg::errors::DecodeErrors;
use zune_png::PngDecoder;
use zune_png::error::PngDecodeErrors;

use super::{Limits, PipelineError};

/// A decoded image, RGB8, rows top to bottom, no padding.
///
/// A DCT-scaled decode is `eighths`/8 of the stored image, by an exact factor: pixel `i` of it
/// covers the stored pixels `[i * 8 / eighths, (i + 1) * 8 / eighths)` (fractional bounds at
/// 3/8, 5/8, 6/8 or 7/8: each 8×8 block becomes M×M pixels), and a side is
/// ⌈stored × `eighths` / 8⌉ long, the last pixel reaching past the stored side when the
/// division is not exact.
#[derive(Debug)]
pub(super) struct Rgb {
    pub data: Vec<u8>,
    pub width: u32,
    pub height: u32,
    /// The DCT scale in eighths of the stored size: 8 (full size), or 1 to 7.
    pub eighths: u32,
    /// Width and height of the stored image.
    pub stored: (u32, u32),
}

impl Rgb {
    fn full(data: Vec<u8>, width: u32, height: u32) -> Self {
        Rgb {
            data,
            width,
            height,
            eighths: 8,
            stored: (width, height),
        }
    }
}

enum Format {
    Jpeg,
    Png,
    Webp,
}

const PNG_MAGIC: &[u8] = b"\x89PNG\r\n\x1a\n";

/// Recognises the format from the magic bytes. Formats we know but do not decode are
/// `Unsupported` (a clearer message than "not an image").
fn sniff(bytes: &[u8]) -> Result<Format, PipelineError> {
    if bytes.starts_with(&[0xFF, 0xD8, 0xFF]) {
        return Ok(Format::Jpeg);
    }
    if bytes.starts_with(PNG_MAGIC) {
        return Ok(Format::Png);
    }
    if bytes.len() >= 12 && bytes.starts_with(b"RIFF") && &bytes[8..12] == b"WEBP" {
        return Ok(Format::Webp);
    }
    let other = if bytes.starts_with(b"GIF87a") || bytes.starts_with(b"GIF89a") {
        "gif"
    } else if bytes.starts_with(b"II*\0") || bytes.starts_with(b"MM\0*") {
        "tiff"
    } else if bytes.len() >= 26 && bytes.starts_with(b"BM") {
        "bmp"
    } else {
        return Err(PipelineError::NotAnImage);
    };
    Err(PipelineError::Unsupported(format!(
        "{other} images are not supported (only jpeg, png and webp)"
    )))
}

/// The decoders' own dimension caps are lifted to the format maxima so that our
/// `max_pixels` is the one limit that applies.
fn decoder_options() -> DecoderOptions {
    DecoderOptions::new_fast()
        .set_strict_mode(true)
        .set_max_width(usize::from(u16::MAX))
        .set_max_height(usize::from(u16::MAX))
}

fn check_pixels(width: usize, height: usize, limits: &Limits) -> Result<(), PipelineError> {
    let (w, h) = (width as u64, height as u64);
    if w == 0 || h == 0 {
        return Err(PipelineError::Corrupt("image has a zero dimension".into()));
    }
    if w.saturating_mul(h) > limits.max_pixels {
        return Err(PipelineError::TooLarge {
            width: w,
            height: h,
            max_pixels: limits.max_pixels,
        });
    }
    Ok(())
}

/// Decodes a JPEG, PNG or WebP to RGB8.
///
/// With `resize_shorter`, a JPEG is decoded at the smallest DCT scale (M/8 for M in
/// `eighths`, else full size) whose output is still larger than the resize's by a margin (see
/// [`super::scaled::dct_eighths`]); `None` or no `eighths` decodes at full size.
pub(super) fn decode_rgb(
    bytes: &[u8],
    limits: &Limits,
    resize_shorter: Option<u32>,
    eighths: &[u32],
) -> Result<Rgb, PipelineError> {
    match sniff(bytes)? {
        Format::Jpeg => decode_jpeg(bytes, limits, resize_shorter, eighths),
        Format::Png => decode_png(bytes, limits),
        Format::Webp => decode_webp(bytes, limits),
    }
}

/// Width and height from the header alone.
pub(super) fn dimensions(bytes: &[u8]) -> Result<(u32, u32), PipelineError> {
    let (w, h) = match sniff(bytes)? {
        Format::Jpeg => {
            let mut dec = JpegDecoder::new_with_options(ZCursor::new(bytes), decoder_options());
            dec.decode_headers().map_err(jpeg_error)?;
            dec.dimensions()
        }
        Format::Png => {
            let mut dec = PngDecoder::new_with_options(ZCursor::new(bytes), decoder_options());
            dec.decode_headers().map_err(png_error)?;
            dec.dimensions()
        }
        Format::Webp => {
            let (w, h) = webp_decoder(bytes)?.dimensions();
            Some((w as usize, h as usize))
        }
    }
    .ok_or_else(|| PipelineError::Corrupt("no image header".into()))?;
    Ok((w as u32, h as u32))
}

fn jpeg_error(e: DecodeErrors) -> PipelineError {
    match e {
        DecodeErrors::Unsupported(s) => {
            PipelineError::Unsupported(format!("jpeg: {s:?}").to_lowercase())
        }
        other => PipelineError::Corrupt(format!("jpeg: {other}").to_lowercase()),
    }
}

/// zune-jpeg (strict) reads the header and decodes full-size images, where it is the fastest
/// decoder we measured; libjpeg-turbo (through `mozjpeg`) decodes the DCT-scaled ones, which
/// zune-jpeg cannot. CMYK and YCCK images are always decoded at full size by zune-jpeg.
fn decode_jpeg(
    bytes: &[u8],
    limits: &Limits,
    resize_shorter: Option<u32>,
    eighths: &[u32],
) -> Result<Rgb, PipelineError> {
    let options = decoder_options().jpeg_set_out_colorspace(ColorSpace::RGB);
    let mut dec = JpegDecoder::new_with_options(ZCursor::new(bytes), options);
    dec.decode_headers().map_err(jpeg_error)?;
    let (w, h) = dec
        .dimensions()
        .ok_or_else(|| PipelineError::Corrupt("jpeg: no frame header".into()))?;
    check_pixels(w, h, limits)?;
    let scalable = matches!(
        dec.input_colorspace(),
        Some(ColorSpace::YCbCr | ColorSpace::RGB | ColorSpace::Luma)
    );
    if let Some(target) = resize_shorter
        && scalable
    {
        let (w, h) = (w as u32, h as u32);
        let (nw, nh) = super::resize::resized_size(w, h, target);
        let m = super::scaled::dct_eighths(eighths, w, h, nw, nh);
        if m < 8 {
            return super::scaled::decode(bytes, (w, h), m);
        }
    }
    let size = dec
        .output_buffer_size()
        .ok_or_else(|| PipelineError::Corrupt("jpeg: size overflows".into()))?;
    if size != w * h * 3 {
        return Err(PipelineError::Unsupported(
            "jpeg: decoder did not produce rgb".into(),
        ));
    }
    let mut data = vec![0u8; size];
    dec.decode_into(&mut data).map_err(jpeg_error)?;
    Ok(Rgb::full(data, w as u32, h as u32))
}

fn png_error(e: PngDecodeErrors) -> PipelineError {
    match e {
        PngDecodeErrors::UnsupportedAPNGImage => {
            PipelineError::Unsupported("png: unsupported animated png".into())
        }
        other => PipelineError::Corrupt(format!("png: {other}").trim().to_lowercase()),
    }
}

fn decode_png(bytes: &[u8], limits: &Limits) -> Result<Rgb, PipelineError> {
    let options = decoder_options().png_set_strip_to_8bit(true);
    let mut dec = PngDecoder::new_with_options(ZCursor::new(bytes), options);
    dec.decode_headers().map_err(png_error)?;
    let (w, h) = dec
        .dimensions()
        .ok_or_else(|| PipelineError::Corrupt("png: no header".into()))?;
    check_pixels(w, h, limits)?;
    let colorspace = dec
        .colorspace()
        .ok_or_else(|| PipelineError::Corrupt("png: no colorspace".into()))?;
    if dec.depth() != Some(BitDepth::Eight) && dec.depth() != Some(BitDepth::Sixteen) {
        return Err(PipelineError::Unsupported("png: unknown bit depth".into()));
    }
    let raw = dec.decode_raw().map_err(png_error)?;
    let n = w * h;
    let data = match colorspace {
        ColorSpace::RGB => raw,
        ColorSpace::RGBA => rgb_from(&raw, 4, n, |p| [p[0], p[1], p[2]]),
        ColorSpace::Luma => rgb_from(&raw, 1, n, |p| [p[0]; 3]),
        ColorSpace::LumaA => rgb_from(&raw, 2, n, |p| [p[0]; 3]),
        other => {
            return Err(PipelineError::Unsupported(
                format!("png: colorspace {other:?}").to_lowercase(),
            ));
        }
    };
    if data.len() < n * 3 {
        return Err(PipelineError::Corrupt("png: short pixel data".into()));
    }
    Ok(Rgb::full(data, w as u32, h as u32))
}

fn webp_error(e: image_webp::DecodingError) -> PipelineError {
    match e {
        image_webp::DecodingError::UnsupportedFeature(f) => {
            PipelineError::Unsupported(format!("webp: {f}").to_lowercase())
        }
        other => PipelineError::Corrupt(format!("webp: {other}").to_lowercase()),
    }
}

fn webp_decoder(bytes: &[u8]) -> Result<WebPDecoder<std::io::Cursor<&[u8]>>, PipelineError> {
    WebPDecoder::new(std::io::Cursor::new(bytes)).map_err(webp_error)
}

/// Lossy or lossless WebP (image-webp, pure Rust); an animation is refused, alpha dropped.
fn decode_webp(bytes: &[u8], limits: &Limits) -> Result<Rgb, PipelineError> {
    let mut dec = webp_decoder(bytes)?;
    if dec.is_animated() {
        return Err(PipelineError::Unsupported(
            "webp: unsupported animated webp".into(),
        ));
    }
    let (w, h) = dec.dimensions();
    check_pixels(w as usize, h as usize, limits)?;
    let size = dec
        .output_buffer_size()
        .ok_or_else(|| PipelineError::Corrupt("webp: image too large".into()))?;
    let mut raw = vec![0u8; size];
    dec.read_image(&mut raw).map_err(webp_error)?;
    let n = w as usize * h as usize;
    let data = if dec.has_alpha() {
        rgb_from(&raw, 4, n, |p| [p[0], p[1], p[2]])
    } else {
        raw
    };
    if data.len() < n * 3 {
        return Err(PipelineError::Corrupt("webp: short pixel data".into()));
    }
    Ok(Rgb::full(data, w, h))
}

/// Converts `n` pixels of `channels` bytes each into RGB8 (drops alpha, replicates gray).
fn rgb_from(src: &[u8], channels: usize, n: usize, f: impl Fn(&[u8]) -> [u8; 3]) -> Vec<u8> {
    let mut out = Vec::with_capacity(n * 3);
    for p in src.chunks_exact(channels).take(n) {
        out.extend_from_slice(&f(p));
    }
    out
}
