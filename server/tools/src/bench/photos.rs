//! Real photographs for `joader bench decode` and the pipeline's image-quality tests.
//!
//! Generated images are easier to decode than photographs and flatter a decoder, so the
//! benchmark uses the colour photos that the scikit-image and scikit-learn packages ship as
//! data files, read where `python3` has those packages installed (the test command's
//! environment has both: `tests/requirements.in`). Nothing is downloaded or installed here.
//! Sizes larger than a photo are mosaics of native-resolution crops of several photos, never
//! upscaled (an upscaled photo is smooth, which flatters the decoder again).

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, Result, bail};
use joader_pipeline::{self as pipeline, Limits, Output, Pipeline};
use jpeg_encoder::{ColorType, Encoder, SamplingFactor};

/// The colour photographs used, as paths inside their installed packages.
pub const PHOTOS: &[&str] = &[
    "skimage/data/astronaut.png",
    "skimage/data/chelsea.png",
    "skimage/data/coffee.png",
    "skimage/data/rocket.jpg",
    "skimage/data/retina.jpg",
    "skimage/data/hubble_deep_field.jpg",
    "skimage/data/motorcycle_left.png",
    "sklearn/datasets/images/china.jpg",
    "sklearn/datasets/images/flower.jpg",
];

/// A decoded source photo, RGB8.
#[derive(Clone, Debug)]
pub struct Photo {
    pub name: String,
    pub rgb: Vec<u8>,
    pub width: u32,
    pub height: u32,
}

/// The default cache folder of the benches' generated files: `$XDG_CACHE_HOME/joader`, else
/// `~/.cache/joader`, else a folder in the system's temporary directory.
pub fn default_cache() -> PathBuf {
    if let Some(x) = std::env::var_os("XDG_CACHE_HOME").filter(|x| !x.is_empty()) {
        return PathBuf::from(x).join("joader");
    }
    if let Some(h) = std::env::var_os("HOME").filter(|h| !h.is_empty()) {
        return PathBuf::from(h).join(".cache").join("joader");
    }
    std::env::temp_dir().join("joader-cache")
}

/// Reads and decodes the photos of [`PHOTOS`] from the scikit-image and scikit-learn packages
/// that `python3` imports.
pub fn fetch() -> Result<Vec<Photo>> {
    let roots = package_roots()?;
    PHOTOS
        .iter()
        .map(|p| {
            let (package, rest) = p.split_once('/').unwrap_or((p, ""));
            let path = roots
                .iter()
                .find(|(name, _)| name == package)
                .map(|(_, dir)| dir.join(rest))
                .with_context(|| format!("no folder for the package {package}"))?;
            let bytes = std::fs::read(&path).with_context(|| {
                format!(
                    "read {} (the installed {package} lacks a photo it used to ship)",
                    path.display()
                )
            })?;
            let full = Pipeline::Decode {
                resize_shorter: None,
                center_crop: None,
            };
            match pipeline::run(&full, &bytes, &Limits::default()) {
                Ok(Output::Hwc {
                    data,
                    height,
                    width,
                    ..
                }) => Ok(Photo {
                    name: base(p).to_string(),
                    rgb: data,
                    width,
                    height,
                }),
                Ok(Output::Raw(_)) => bail!("decoding {} gave raw bytes", path.display()),
                Err(e) => bail!("decode {}: {e}", path.display()),
            }
        })
        .collect()
}

fn base(p: &str) -> &str {
    p.rsplit('/').next().unwrap_or(p)
}

/// The folders of the `skimage` and `sklearn` packages as `python3` finds them, without
/// importing them (`importlib.util.find_spec`).
fn package_roots() -> Result<Vec<(String, PathBuf)>> {
    const SCRIPT: &str = r#"
import importlib.util, sys
for name in sys.argv[1:]:
    spec = importlib.util.find_spec(name)
    if spec is None or not spec.submodule_search_locations:
        sys.exit(f"python3 ({sys.executable}) cannot find the package {name}")
    print(name, list(spec.submodule_search_locations)[0], sep="\t")
"#;
    let out = Command::new("python3")
        .args(["-c", SCRIPT, "skimage", "sklearn"])
        .output()
        .context("run python3 (the photos are data files of its scikit-image and scikit-learn)")?;
    if !out.status.success() {
        bail!(
            "the photos come from the scikit-image and scikit-learn packages, and {} \
             (the test command's environment has them: source tests/pyenv.sh)",
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| l.split_once('\t'))
        .map(|(name, dir)| (name.to_string(), PathBuf::from(dir)))
        .collect())
}

/// A `width`×`height` RGB8 picture made from photo `k`: its center if it is large enough,
/// else a grid of equal cells, each a native-resolution center crop of a photo large enough
/// for a cell (starting with photo `k`, so that each `k` gives a different picture).
pub fn picture(photos: &[Photo], k: usize, width: u32, height: u32) -> Vec<u8> {
    let own = &photos[k % photos.len()];
    if own.width >= width && own.height >= height {
        return crop(own, width, height);
    }
    let (mut cols, mut rows) = (width.div_ceil(own.width), height.div_ceil(own.height));
    let (cw, ch, fit) = loop {
        let (cw, ch) = (width.div_ceil(cols), height.div_ceil(rows));
        let fit: Vec<&Photo> = photos
            .iter()
            .cycle()
            .skip(k % photos.len())
            .take(photos.len())
            .filter(|p| p.width >= cw && p.height >= ch)
            .collect();
        if fit.len() >= 2 {
            break (cw, ch, fit);
        }
        if cw >= ch {
            cols += 1;
        } else {
            rows += 1;
        }
    };
    let mut out = vec![0u8; width as usize * height as usize * 3];
    for r in 0..rows {
        for c in 0..cols {
            let cell = crop(fit[(r * cols + c) as usize % fit.len()], cw, ch);
            let (x0, y0) = (c * cw, r * ch);
            for y in 0..ch.min(height - y0) {
                let w = cw.min(width - x0) as usize * 3;
                let dst = ((y0 + y) as usize * width as usize + x0 as usize) * 3;
                let src = y as usize * cw as usize * 3;
                out[dst..dst + w].copy_from_slice(&cell[src..src + w]);
            }
        }
    }
    out
}

fn crop(p: &Photo, w: u32, h: u32) -> Vec<u8> {
    let (x0, y0) = ((p.width - w) / 2, (p.height - h) / 2);
    let mut out = Vec::with_capacity(w as usize * h as usize * 3);
    for y in y0..y0 + h {
        let s = (y as usize * p.width as usize + x0 as usize) * 3;
        out.extend_from_slice(&p.rgb[s..s + w as usize * 3]);
    }
    out
}

/// How a picture is stored.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Encoding {
    /// Baseline, chroma subsampled 4:2:0 (what cameras and most datasets hold).
    Yuv420,
    /// Baseline, full-resolution chroma.
    Yuv444,
    /// Progressive, 4:2:0.
    Progressive,
    /// Baseline, one gray channel.
    Gray,
}

impl Encoding {
    pub fn name(self) -> &'static str {
        match self {
            Encoding::Yuv420 => "420",
            Encoding::Yuv444 => "444",
            Encoding::Progressive => "progressive",
            Encoding::Gray => "gray",
        }
    }
}

/// Encodes an RGB8 picture as a quality-90 JPEG.
pub fn encode(rgb: &[u8], width: u32, height: u32, encoding: Encoding) -> Result<Vec<u8>> {
    let (w, h) = (
        u16::try_from(width).context("width")?,
        u16::try_from(height).context("height")?,
    );
    let mut out = Vec::new();
    let mut enc = Encoder::new(&mut out, 90);
    enc.set_sampling_factor(match encoding {
        Encoding::Yuv444 => SamplingFactor::F_1_1,
        _ => SamplingFactor::F_2_2,
    });
    enc.set_progressive(encoding == Encoding::Progressive);
    if encoding == Encoding::Gray {
        // BT.601 luma, as a camera's grayscale mode and PIL's convert("L") compute it.
        let gray: Vec<u8> = rgb
            .chunks_exact(3)
            .map(|p| {
                ((299 * u32::from(p[0]) + 587 * u32::from(p[1]) + 114 * u32::from(p[2]) + 500)
                    / 1000) as u8
            })
            .collect();
        enc.encode(&gray, w, h, ColorType::Luma)?;
    } else {
        enc.encode(rgb, w, h, ColorType::Rgb)?;
    }
    Ok(out)
}

/// The benchmark's sizes.
pub const SIZES: &[(u32, u32)] = &[(500, 375), (1000, 750), (2000, 1500), (4000, 3000)];

/// The files of one size: every photo as 4:2:0 and 4:4:4, plus one progressive and one
/// grayscale picture.
#[derive(Debug)]
pub struct SizeSet {
    pub width: u32,
    pub height: u32,
    pub files: Vec<PathBuf>,
}

/// Writes (once; later calls reuse them) the benchmark's files under `cache/corpus-v1`.
pub fn corpus(cache: &Path, photos: &[Photo]) -> Result<Vec<SizeSet>> {
    let root = cache.join("corpus-v1");
    let mut sets = Vec::new();
    for &(width, height) in SIZES {
        let dir = root.join(format!("{width}x{height}"));
        std::fs::create_dir_all(&dir).with_context(|| format!("create {}", dir.display()))?;
        let mut jobs: Vec<(usize, Encoding)> = (0..photos.len())
            .flat_map(|k| [(k, Encoding::Yuv420), (k, Encoding::Yuv444)])
            .collect();
        jobs.push((0, Encoding::Progressive));
        jobs.push((1, Encoding::Gray));
        let mut files = Vec::new();
        for (k, encoding) in jobs {
            let path = dir.join(format!("{}-{}.jpg", photos[k].name, encoding.name()));
            if !path.is_file() {
                let rgb = picture(photos, k, width, height);
                let bytes = encode(&rgb, width, height, encoding)?;
                let tmp = path.with_extension("tmp");
                std::fs::write(&tmp, bytes).with_context(|| format!("write {}", tmp.display()))?;
                std::fs::rename(&tmp, &path)?;
            }
            files.push(path);
        }
        sets.push(SizeSet {
            width,
            height,
            files,
        });
    }
    Ok(sets)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn flat(name: &str, width: u32, height: u32, value: u8) -> Photo {
        Photo {
            name: name.into(),
            rgb: vec![value; width as usize * height as usize * 3],
            width,
            height,
        }
    }

    #[test]
    fn large_enough_photos_are_cropped_and_small_ones_tiled_never_scaled() {
        let photos = vec![
            flat("a", 600, 400, 10),
            flat("b", 451, 300, 20),
            flat("c", 640, 427, 30),
        ];
        // A 500x375 window fits in a and c: a center crop of the photo itself.
        let p = picture(&photos, 0, 500, 375);
        assert!(p.iter().all(|v| *v == 10));
        // 4000x3000 is larger than every photo: tiles of native pixels of several photos,
        // each cell no larger than the photos it comes from.
        let p = picture(&photos, 1, 4000, 3000);
        assert_eq!(p.len(), 4000 * 3000 * 3);
        let mut seen: Vec<u8> = p.clone();
        seen.sort_unstable();
        seen.dedup();
        assert!(seen.len() >= 2, "{seen:?}");
        assert!(seen.iter().all(|v| [10, 20, 30].contains(v)), "{seen:?}");
    }
}
