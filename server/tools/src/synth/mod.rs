//! The demo's generated ImageNet-like dataset: JPEGs in an `ImageFolder` layout whose size
//! and decode cost resemble photos.
//!
//! Flat colours would compress to a few kilobytes and pure noise would be several times
//! larger than a photo; either would make the demo's decode figures meaningless. Each image
//! is therefore a small "scene":
//! - a background gradient between two colours of the class's palette;
//! - multi-octave value noise (fBm) as texture, in brightness and in colour;
//! - a handful of shapes (ellipses, convex polygons, striped bands) with soft edges, each
//!   with its own colour, shading and texture, occluding one another;
//! - a vignette and mild sensor-like noise.
//!
//! Palettes and the mix of shapes depend on the class, so classes are told apart by colour
//! and shape statistics. Everything is derived from the spec's seed with a SplitMix64
//! generator of our own, so a spec always produces the same bytes (on every machine and with
//! any number of threads).
//!
//! Encoding: jpeg-encoder at the spec's quality with 4:2:0 chroma subsampling, as PIL and
//! most cameras do (jpeg-encoder would otherwise keep full chroma at quality ≥ 90).

use std::fs;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc;

use anyhow::Context;
use clap::Args;
use jpeg_encoder::{ColorType, Encoder, SamplingFactor};
use serde::{Deserialize, Serialize};

mod scene;
#[cfg(test)]
mod tests;

use scene::{Scratch, render};

/// Name of the marker file written once a dataset is complete.
pub const MARKER: &str = ".joader-synth.json";

/// Bumped whenever the generator's output changes, so that old datasets are regenerated.
const GENERATOR_VERSION: u32 = 1;

/// What to generate.
#[derive(Clone, Copy, Debug, Serialize, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct SynthSpec {
    pub classes: u32,
    pub per_class: u32,
    pub width: u32,
    pub height: u32,
    /// JPEG quality, 1..=100.
    pub quality: u8,
    pub seed: u64,
}

impl Default for SynthSpec {
    /// The demo's dataset: 10 classes × 300 images of 500×375 at quality 90.
    fn default() -> Self {
        SynthSpec {
            classes: 10,
            per_class: 300,
            width: 500,
            height: 375,
            quality: 90,
            seed: 0,
        }
    }
}

impl SynthSpec {
    /// Number of images of the dataset.
    pub fn images(&self) -> u64 {
        u64::from(self.classes) * u64::from(self.per_class)
    }

    fn validate(&self) -> io::Result<()> {
        let bad = |m: &str| Err(io::Error::new(io::ErrorKind::InvalidInput, m.to_owned()));
        if self.classes == 0 || self.per_class == 0 {
            return bad("synthetic dataset needs at least one class and one image per class");
        }
        if self.width == 0 || self.height == 0 || self.width > 16384 || self.height > 16384 {
            return bad("synthetic image sides must be between 1 and 16384");
        }
        if !(1..=100).contains(&self.quality) {
            return bad("jpeg quality must be between 1 and 100");
        }
        Ok(())
    }
}

#[derive(Serialize, Deserialize, PartialEq)]
struct Marker {
    generator: u32,
    spec: SynthSpec,
}

/// Path of image `index` of class `class` under `dir`.
pub fn image_path(dir: &Path, class: u32, index: u32) -> PathBuf {
    dir.join(format!("class_{class:02}"))
        .join(format!("img_{index:05}.jpg"))
}

/// Writes `dir/class_XX/img_XXXXX.jpg` for the spec and returns the number of images.
///
/// If `dir/.joader-synth.json` already describes the same spec (and generator version) the
/// call returns at once: reruns reuse the data. The marker is written last, so an
/// interrupted run is redone. Stale `class_XX` folders and `img_XXXXX.jpg` files left by a
/// different earlier spec are removed; nothing else in `dir` is touched. `progress` gets the
/// number of images written so far.
pub fn generate_image_folder(
    dir: &Path,
    spec: &SynthSpec,
    progress: &mut dyn FnMut(u64),
) -> io::Result<u64> {
    spec.validate()?;
    let marker = Marker {
        generator: GENERATOR_VERSION,
        spec: *spec,
    };
    let marker_path = dir.join(MARKER);
    if let Ok(text) = fs::read_to_string(&marker_path)
        && serde_json::from_str::<Marker>(&text).is_ok_and(|m| m == marker)
        && image_path(dir, spec.classes - 1, spec.per_class - 1).is_file()
    {
        return Ok(spec.images());
    }
    match fs::remove_file(&marker_path) {
        Err(e) if e.kind() != io::ErrorKind::NotFound => return Err(e),
        _ => {}
    }
    fs::create_dir_all(dir)?;
    remove_stale(dir, spec)?;
    for class in 0..spec.classes {
        fs::create_dir_all(dir.join(format!("class_{class:02}")))?;
    }

    let total = spec.images();
    let next = AtomicU64::new(0);
    let failed = AtomicBool::new(false);
    let threads = std::thread::available_parallelism()
        .map_or(2, |n| n.get())
        .clamp(1, 8) as u64;
    let (tx, rx) = mpsc::channel::<io::Result<()>>();
    std::thread::scope(|s| -> io::Result<()> {
        for _ in 0..threads.min(total) {
            let tx = tx.clone();
            let (next, failed) = (&next, &failed);
            s.spawn(move || {
                let mut scratch = Scratch::default();
                loop {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    if i >= total || failed.load(Ordering::Relaxed) {
                        break;
                    }
                    let class = (i / u64::from(spec.per_class)) as u32;
                    let index = (i % u64::from(spec.per_class)) as u32;
                    let r = write_image(dir, spec, class, index, &mut scratch);
                    if r.is_err() {
                        failed.store(true, Ordering::Relaxed);
                    }
                    if tx.send(r).is_err() {
                        break;
                    }
                }
            });
        }
        drop(tx);
        let mut done = 0u64;
        for r in rx {
            r?;
            done += 1;
            if done.is_multiple_of(16) || done == total {
                progress(done);
            }
        }
        Ok(())
    })?;

    let tmp = dir.join(format!("{MARKER}.tmp"));
    fs::write(&tmp, serde_json::to_vec_pretty(&marker)?)?;
    fs::rename(&tmp, &marker_path)?;
    Ok(total)
}

/// Parses `prefix` followed by digits and `suffix` (e.g. `img_00012.jpg`).
fn numbered(name: &str, prefix: &str, suffix: &str) -> Option<u32> {
    let digits = name.strip_prefix(prefix)?.strip_suffix(suffix)?;
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    digits.parse().ok()
}

/// Removes what an earlier, larger spec left: `class_XX` folders beyond `classes` and
/// `img_XXXXX.jpg` files beyond `per_class`.
fn remove_stale(dir: &Path, spec: &SynthSpec) -> io::Result<()> {
    for entry in fs::read_dir(dir)? {
        let entry = entry?;
        let name = entry.file_name();
        let Some(class) = name.to_str().and_then(|n| numbered(n, "class_", "")) else {
            continue;
        };
        if !entry.file_type()?.is_dir() {
            continue;
        }
        if class >= spec.classes {
            fs::remove_dir_all(entry.path())?;
            continue;
        }
        for img in fs::read_dir(entry.path())? {
            let img = img?;
            let stale = img
                .file_name()
                .to_str()
                .and_then(|n| numbered(n, "img_", ".jpg"))
                .is_some_and(|i| i >= spec.per_class);
            if stale {
                fs::remove_file(img.path())?;
            }
        }
    }
    Ok(())
}

fn write_image(
    dir: &Path,
    spec: &SynthSpec,
    class: u32,
    index: u32,
    scratch: &mut Scratch,
) -> io::Result<()> {
    render(spec, class, index, scratch);
    scratch.jpeg.clear();
    let mut enc = Encoder::new(&mut scratch.jpeg, spec.quality);
    enc.set_sampling_factor(SamplingFactor::F_2_2);
    enc.encode(
        &scratch.pixels,
        spec.width as u16,
        spec.height as u16,
        ColorType::Rgb,
    )
    .map_err(|e| io::Error::other(format!("jpeg encoding failed: {e}").to_lowercase()))?;
    fs::write(image_path(dir, class, index), &scratch.jpeg)
}

/// `joader gen-dataset`: the arguments of [`generate_image_folder`].
#[derive(Debug, Args)]
pub struct GenDatasetArgs {
    /// Output folder (created; reused when it already holds the same dataset).
    #[arg(long)]
    pub out: PathBuf,
    #[arg(long, default_value_t = 10)]
    pub classes: u32,
    #[arg(long, default_value_t = 100)]
    pub per_class: u32,
    #[arg(long, default_value_t = 500)]
    pub width: u32,
    #[arg(long, default_value_t = 375)]
    pub height: u32,
    #[arg(long, default_value_t = 90)]
    pub quality: u8,
    #[arg(long, default_value_t = 2022)]
    pub seed: u64,
}

/// `joader gen-dataset`.
pub fn gen_dataset(a: GenDatasetArgs) -> anyhow::Result<()> {
    let spec = SynthSpec {
        classes: a.classes,
        per_class: a.per_class,
        width: a.width,
        height: a.height,
        quality: a.quality,
        seed: a.seed,
    };
    let n = generate_image_folder(&a.out, &spec, &mut |_| {})
        .with_context(|| format!("cannot generate the dataset in {}", a.out.display()))?;
    println!("{n} images in {}", a.out.display());
    Ok(())
}
