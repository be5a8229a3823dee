//! The shared, deterministic part of data preparation: what the Loader runs once per element
//! and the Cache shares between every job that asked for the same element with the same
//! pipeline.
//!
//! A [`Pipeline`] is either `raw` (the stored bytes, unchanged) or `decode`: JPEG (zune-jpeg,
//! or libjpeg-turbo when the image can be decoded smaller) or PNG (zune-png) to RGB8, then an
//! optional resize of the shorter side (fast_image_resize), then an optional center crop,
//! giving HWC `u8` RGB.
//!
//! Decisions, and why:
//! - **DCT-scaled JPEG decoding**: when the resize shrinks a JPEG by 2× or more, it is
//!   decoded at the smallest of the scales 1/8, 1/4, 1/2, 5/8 ([`DCT_EIGHTHS`]) whose output
//!   still covers the resize ([`scaled`]), the way Pillow's `draft()` does (with M/8 where
//!   `draft()` has only 1/k); the result differs from a full decode and resize
//!   ([`run_full_decode`]) by less than 2 levels on average (tested on real photos). libjpeg
//!   also decodes at 3/8, 6/8 and 7/8, without SIMD; measured no faster, they stay out of the
//!   default ([`run_with_scales`] tries them).
//! - **Resize filter: antialiased bilinear** (`Convolution(Bilinear)`), the filter of PIL's
//!   and torchvision's default `Resize` on images, so models see what they would see with a
//!   torchvision input pipeline. The other side is `round(other * target / shorter)`.
//! - **Resize and crop are fused**: the center crop is expressed as a source crop box, so only
//!   the kept pixels are computed. The crop offset is an integer in resized coordinates
//!   (`(resized - crop) / 2`, rounded down), which makes the result the same as resizing the
//!   whole image and cutting the crop out of it.
//! - **Everything is deterministic**: the same bytes give the same pixels on the same
//!   machine (SIMD paths are picked from the CPU's features, so two different CPUs may
//!   differ in the last bit; the cache never leaves the machine).
//! - **Corruption is an error, not a grey patch**: the JPEG decoder runs in strict mode, so a
//!   truncated file is [`PipelineError::Corrupt`] rather than an image padded with grey.
//! - **Alpha is dropped**, as PIL's `convert("RGB")` does; grayscale is replicated into the
//!   three channels, CMYK/YCCK JPEGs are converted by the decoder (at full size).
//! - **EXIF orientation is not applied**: pixels come in stored order, as torchvision's
//!   `decode_jpeg` gives them by default (and PIL's `Image.open`, without `exif_transpose`).
//! - **Size limits are checked on the header, before any pixel is decoded**, and again on the
//!   output size of the resize.
//!
//! Random augmentation never happens here: it is per job, after the cache.
// Functions read as their steps: none over the threshold of the folder's `clippy.toml`.
#![warn(clippy::too_many_lines)]

mod decode;
#[cfg(test)]
mod fuzz;
mod resize;
mod scaled;
#[cfg(test)]
mod tests;

pub use scaled::DCT_EIGHTHS;

use joader_stages as stages;
pub use stage::{DECODE, RESIZE};

/// The stages of the daemon's CPU accounting this crate marks (`joader_stage_cpu_seconds_total`).
pub mod stage {
    use joader_stages::Stage;
    /// Decoding an image to RGB8.
    pub static DECODE: Stage = Stage::new("decode");
    /// Resizing and cropping the decoded image.
    pub static RESIZE: Stage = Stage::new("resize");
}
use serde::{Deserialize, Serialize};

/// Largest width, height, resize target or crop side a pipeline may ask for.
pub const MAX_SIDE: u32 = 16384;

/// The shared preparation of an element, part of the cache key.
///
/// JSON: `{"kind": "raw"}` or `{"kind": "decode", "resize_shorter": 256, "center_crop": [224,
/// 224]}`; unknown fields are refused.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(tag = "kind", rename_all = "snake_case", deny_unknown_fields)]
// serde ignores `deny_unknown_fields` for the unit variant of an internally tagged enum, so
// deserialization goes through a flat wire form that refuses unknown fields for every kind.
#[serde(try_from = "PipelineWire")]
pub enum Pipeline {
    /// The stored bytes, unchanged.
    Raw,
    /// Decode to RGB8, then optionally resize the shorter side, then optionally center crop.
    Decode {
        /// Target length of the shorter side; the other side keeps the aspect ratio.
        #[serde(default)]
        resize_shorter: Option<u32>,
        /// `[height, width]` of a center crop, taken after the resize.
        #[serde(default)]
        center_crop: Option<[u32; 2]>,
    },
}

#[derive(Deserialize)]
#[serde(rename_all = "snake_case")]
enum PipelineKind {
    Raw,
    Decode,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct PipelineWire {
    kind: PipelineKind,
    #[serde(default)]
    resize_shorter: Option<u32>,
    #[serde(default)]
    center_crop: Option<[u32; 2]>,
}

impl TryFrom<PipelineWire> for Pipeline {
    type Error = String;

    fn try_from(w: PipelineWire) -> Result<Self, String> {
        match w.kind {
            PipelineKind::Raw if w.resize_shorter.is_some() || w.center_crop.is_some() => {
                Err("the raw pipeline takes no resize_shorter or center_crop".into())
            }
            PipelineKind::Raw => Ok(Pipeline::Raw),
            PipelineKind::Decode => Ok(Pipeline::Decode {
                resize_shorter: w.resize_shorter,
                center_crop: w.center_crop,
            }),
        }
    }
}

/// Limits that protect the server from hostile or broken input.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limits {
    /// Largest number of pixels (width × height) decoded or produced for one element.
    pub max_pixels: u64,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_pixels: 100_000_000,
        }
    }
}

/// What a pipeline produces for one element.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Output {
    /// The stored bytes ([`Pipeline::Raw`]).
    Raw(Vec<u8>),
    /// Pixels in HWC order, `u8`, RGB (`channels` is always 3).
    Hwc {
        data: Vec<u8>,
        height: u32,
        width: u32,
        channels: u32,
    },
}

impl Output {
    /// Number of bytes of the payload.
    pub fn len(&self) -> usize {
        match self {
            Output::Raw(b) => b.len(),
            Output::Hwc { data, .. } => data.len(),
        }
    }

    /// True if the payload has no byte.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// Why a pipeline could not prepare an element (or why a pipeline is invalid).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PipelineError {
    #[error("not an image: neither jpeg nor png")]
    NotAnImage,
    #[error("corrupt image: {0}")]
    Corrupt(String),
    #[error("image too large: {width}x{height} is more than {max_pixels} pixels")]
    TooLarge {
        width: u64,
        height: u64,
        max_pixels: u64,
    },
    #[error("unsupported image: {0}")]
    Unsupported(String),
    #[error("center crop {crop_height}x{crop_width} is larger than the image {height}x{width}")]
    CropTooLarge {
        crop_height: u32,
        crop_width: u32,
        height: u32,
        width: u32,
    },
    #[error("bad pipeline: {0}")]
    BadParameters(String),
}

impl PipelineError {
    /// Stable machine-readable code.
    pub fn code(&self) -> &'static str {
        match self {
            PipelineError::NotAnImage => "not_an_image",
            PipelineError::Corrupt(_) => "corrupt_image",
            PipelineError::TooLarge { .. } => "image_too_large",
            PipelineError::Unsupported(_) => "unsupported_image",
            PipelineError::CropTooLarge { .. } => "crop_too_large",
            PipelineError::BadParameters(_) => "bad_pipeline",
        }
    }
}

impl Pipeline {
    /// Checks the parameters: every size in `1..=MAX_SIDE`, and a crop that can fit at least
    /// some image after the resize.
    pub fn validate(&self) -> Result<(), PipelineError> {
        let Pipeline::Decode {
            resize_shorter,
            center_crop,
        } = self
        else {
            return Ok(());
        };
        let check = |what: &str, v: u32| {
            if v == 0 || v > MAX_SIDE {
                Err(PipelineError::BadParameters(format!(
                    "{what} must be between 1 and {MAX_SIDE}, got {v}"
                )))
            } else {
                Ok(())
            }
        };
        if let Some(r) = resize_shorter {
            check("resize_shorter", *r)?;
        }
        if let Some([h, w]) = center_crop {
            check("center_crop height", *h)?;
            check("center_crop width", *w)?;
            if let Some(r) = resize_shorter
                && (*h).min(*w) > *r
            {
                // After the resize one side equals `r`, so both crop sides being longer can
                // never fit any image.
                return Err(PipelineError::BadParameters(format!(
                    "center_crop {h}x{w} can never fit an image whose shorter side is {r}"
                )));
            }
        }
        Ok(())
    }

    /// A short, stable text id of the pipeline (part of cache keys and metric labels), e.g.
    /// `raw`, `decode`, `decode-r256`, `decode-c224x224`, `decode-r256-c224x224`.
    pub fn key(&self) -> String {
        match self {
            Pipeline::Raw => "raw".to_owned(),
            Pipeline::Decode {
                resize_shorter,
                center_crop,
            } => {
                let mut k = "decode".to_owned();
                if let Some(r) = resize_shorter {
                    k.push_str(&format!("-r{r}"));
                }
                if let Some([h, w]) = center_crop {
                    k.push_str(&format!("-c{h}x{w}"));
                }
                k
            }
        }
    }
}

/// Runs the pipeline on the stored bytes of one element. The calling thread's CPU time is
/// charged to the stages `decode` and `resize` apart (`dataplane::stages`; every variant
/// below does the same): the server's `joader_stage_cpu_seconds_total`.
pub fn run(p: &Pipeline, bytes: &[u8], limits: &Limits) -> Result<Output, PipelineError> {
    run_with_scales(p, bytes, limits, DCT_EIGHTHS)
}

/// [`run`] with every JPEG decoded at full size before the resize: the reference that the
/// DCT-scaled path is tested and benchmarked against.
pub fn run_full_decode(
    p: &Pipeline,
    bytes: &[u8],
    limits: &Limits,
) -> Result<Output, PipelineError> {
    run_with_scales(p, bytes, limits, &[])
}

/// [`run`] with the DCT scales `eighths` (M of M/8, any order; values outside 1..=7 are
/// ignored) instead of [`DCT_EIGHTHS`]: how the benchmark (`joader bench decode --eighths`)
/// and the quality tests try the scales that the default leaves out. A JPEG is decoded at
/// the smallest of them whose output covers the resize with the margin that
/// [`DCT_EIGHTHS`] has, else at full size.
pub fn run_with_scales(
    p: &Pipeline,
    bytes: &[u8],
    limits: &Limits,
    eighths: &[u32],
) -> Result<Output, PipelineError> {
    match decode_with_scales(p, bytes, limits, eighths)? {
        None => Ok(Output::Raw(bytes.to_vec())),
        Some(d) => d.finish(),
    }
}

/// An element decoded, its output's size known and checked, its resize and crop not yet
/// done: [`Decoded::resize_into`] writes the output wherever the caller has a place for it
/// (the server's loader threads: straight into a shared-memory slot), [`Decoded::finish`]
/// into a new buffer. Either gives the bytes [`run`] gives.
pub struct Decoded {
    img: decode::Rgb,
    plan: resize::Plan,
}

impl Decoded {
    /// `(height, width, channels)` of the output (HWC, RGB8).
    pub fn shape(&self) -> (u32, u32, u32) {
        (self.plan.ch, self.plan.cw, 3)
    }

    /// `(height, width)` of the stored image, before any DCT scaling, resize or crop: what
    /// annotations made on the original image are scaled from.
    pub fn source_size(&self) -> (u32, u32) {
        (self.img.stored.1, self.img.stored.0)
    }

    /// Bytes of the output.
    pub fn len(&self) -> usize {
        self.plan.len()
    }

    /// True if the output has no byte (never: sides are at least 1).
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Resizes and crops into `dst`, which must hold exactly [`Decoded::len`] bytes (charged
    /// to the stage `resize`).
    pub fn resize_into(&self, dst: &mut [u8]) -> Result<(), PipelineError> {
        let _resizing = stages::enter(&RESIZE);
        resize::apply_into(&self.img, &self.plan, dst)
    }

    /// Resizes and crops into a new buffer.
    pub fn finish(self) -> Result<Output, PipelineError> {
        let _resizing = stages::enter(&RESIZE);
        let (height, width, channels) = self.shape();
        let data = if self.plan.is_identity(&self.img) {
            self.img.data
        } else {
            let mut data = vec![0u8; self.plan.len()];
            resize::apply_into(&self.img, &self.plan, &mut data)?;
            data
        };
        Ok(Output::Hwc {
            data,
            height,
            width,
            channels,
        })
    }
}

/// The first half of [`run`]: decodes a `decode` pipeline's element and checks its output's
/// size; `None` for [`Pipeline::Raw`] (whose output is the stored bytes).
pub fn decode(
    p: &Pipeline,
    bytes: &[u8],
    limits: &Limits,
) -> Result<Option<Decoded>, PipelineError> {
    decode_with_scales(p, bytes, limits, DCT_EIGHTHS)
}

fn decode_with_scales(
    p: &Pipeline,
    bytes: &[u8],
    limits: &Limits,
    eighths: &[u32],
) -> Result<Option<Decoded>, PipelineError> {
    match p {
        Pipeline::Raw => Ok(None),
        Pipeline::Decode {
            resize_shorter,
            center_crop,
        } => {
            p.validate()?;
            let decoding = stages::enter(&DECODE);
            let img = decode::decode_rgb(bytes, limits, *resize_shorter, eighths)?;
            drop(decoding);
            let plan = resize::plan(&img, *resize_shorter, *center_crop, limits)?;
            Ok(Some(Decoded { img, plan }))
        }
    }
}

/// Width and height of a JPEG or PNG, read from its header alone.
pub fn dimensions(bytes: &[u8]) -> Result<(u32, u32), PipelineError> {
    decode::dimensions(bytes)
}
