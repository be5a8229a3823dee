//! Copying a batch of images out of shared memory into one contiguous
//! `(B, H, W, C)` array, optionally through the per-job augmentation.

use crate::augment::{Augmenter, Crop, ItemOut, Output, RandomResizedCrop};
use crate::error::{Error, Result};
use crate::layout::Format;
use crate::reader::ItemMeta;

/// A collated batch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Collated {
    /// `B × H × W × C` bytes, row-major.
    pub images: Vec<u8>,
    /// `B` labels.
    pub labels: Vec<i64>,
    /// `[B, H, W, C]`.
    pub shape: [usize; 4],
}

/// True if the item is a sample without an image (its small fields only: an `array` dataset's
/// row, a text-only shard's key): raw bytes of length 0.
pub fn is_imageless(m: &ItemMeta) -> bool {
    m.format == Format::Raw && m.len == 0
}

/// Shape `[B, H, W, C]` of the collated batch; all items must be HWC u8 of one shape, or all
/// samples without an image (`[B, 0, 0, 0]`: nothing to copy, the fields are the sample).
pub fn batch_shape(items: &[ItemMeta]) -> Result<[usize; 4]> {
    let Some(first) = items.first() else {
        return Ok([0, 0, 0, 0]);
    };
    if is_imageless(first) {
        if let Some(other) = items.iter().find(|m| !is_imageless(m)) {
            return Err(Error::Collate(format!(
                "element {} has no image but element {} has one: a batch is all images or \
                 all samples without one",
                first.element_id, other.element_id
            )));
        }
        return Ok([items.len(), 0, 0, 0]);
    }
    let Format::HwcU8 {
        height,
        width,
        channels,
    } = first.format
    else {
        return Err(Error::Collate(format!(
            "element {} is raw bytes; only HWC u8 images can be collated",
            first.element_id
        )));
    };
    for it in items {
        if it.format != first.format {
            return Err(Error::Collate(format!(
                "element {} has format {:?}, element {} has {:?}; use the same resize for every element or read views",
                it.element_id, it.format, first.element_id, first.format
            )));
        }
    }
    Ok([
        items.len(),
        height as usize,
        width as usize,
        channels as usize,
    ])
}

fn check_out(shape: [usize; 4], images: &[u8], labels: &[i64]) -> Result<usize> {
    let per = shape[1] * shape[2] * shape[3];
    let need = per * shape[0];
    if images.len() < need || labels.len() < shape[0] {
        return Err(Error::Collate(format!(
            "output too small: need {need} image bytes and {} labels, got {} and {}",
            shape[0],
            images.len(),
            labels.len()
        )));
    }
    Ok(per)
}

/// Copies `items` into `images` (at least `B·H·W·C` bytes) and `labels`.
pub fn collate_into(
    items: &[(ItemMeta, &[u8])],
    images: &mut [u8],
    labels: &mut [i64],
) -> Result<[usize; 4]> {
    let metas: Vec<ItemMeta> = items.iter().map(|i| i.0).collect();
    let shape = batch_shape(&metas)?;
    let per = check_out(shape, images, labels)?;
    let stream = per * items.len() >= crate::copy::STREAM_THRESHOLD;
    for (k, (meta, data)) in items.iter().enumerate() {
        crate::copy::copy(&mut images[k * per..(k + 1) * per], data, stream);
        labels[k] = meta.label;
    }
    Ok(shape)
}

/// Allocating version of [`collate_into`].
pub fn collate(items: &[(ItemMeta, &[u8])]) -> Result<Collated> {
    let metas: Vec<ItemMeta> = items.iter().map(|i| i.0).collect();
    let shape = batch_shape(&metas)?;
    let mut images = vec![0u8; shape.iter().product()];
    let mut labels = vec![0i64; shape[0]];
    collate_into(items, &mut images, &mut labels)?;
    Ok(Collated {
        images,
        labels,
        shape,
    })
}

/// Shape `[B, aug.height, aug.width, C]` of the augmented batch; the items
/// must be HWC u8 images (of any size) with the same channels.
pub fn augmented_shape(items: &[ItemMeta], aug: &RandomResizedCrop) -> Result<[usize; 4]> {
    let mut channels = None;
    for m in items {
        let Format::HwcU8 { channels: c, .. } = m.format else {
            let what = if is_imageless(m) {
                "has no image (a sample of fields only): give its job no transform"
            } else {
                "is raw bytes; only HWC u8 images can be augmented"
            };
            return Err(Error::Collate(format!("element {} {what}", m.element_id)));
        };
        if *channels.get_or_insert(c) != c {
            return Err(Error::Collate("items have different channel counts".into()));
        }
    }
    Ok([
        items.len(),
        aug.height as usize,
        aug.width as usize,
        channels.unwrap_or(0) as usize,
    ])
}

/// Applies `aug` to every item (randomness from `seed`, the item's epoch and
/// position) and writes `(B, aug.height, aug.width, C)` into `images`.
/// Items may have different source sizes but must have the same channels.
pub fn collate_augmented_into(
    items: &[(ItemMeta, &[u8])],
    aug: &RandomResizedCrop,
    seed: u64,
    images: &mut [u8],
    labels: &mut [i64],
) -> Result<[usize; 4]> {
    let threads = default_threads();
    let mut augmenters: Vec<Augmenter> = (0..threads).map(|_| Augmenter::default()).collect();
    write_batch(
        items,
        Some(aug),
        seed,
        &Output::U8Nhwc,
        BatchOut::U8(images),
        labels,
        &mut augmenters,
    )
}

/// Shape `[B, Hmax, Wmax, C]` of the padded batch of `items` ([`Output::U8Padded`]): HWC u8
/// images of any size with the same channels, each in a place as large as the largest.
pub fn padded_shape(items: &[ItemMeta]) -> Result<[usize; 4]> {
    let mut shape = [items.len(), 0, 0, 0];
    for (k, m) in items.iter().enumerate() {
        let Format::HwcU8 {
            height,
            width,
            channels,
        } = m.format
        else {
            return Err(Error::Collate(format!(
                "element {} is raw bytes; only HWC u8 images can be padded",
                m.element_id
            )));
        };
        if k > 0 && shape[3] != channels as usize {
            return Err(Error::Collate("items have different channel counts".into()));
        }
        shape[1] = shape[1].max(height as usize);
        shape[2] = shape[2].max(width as usize);
        shape[3] = channels as usize;
    }
    Ok(shape)
}

/// Writes `items` into `images`, a padded batch whose places are `[H, W, C]` (at least
/// `B·H·W·C` bytes; see [`Output::U8Padded`]), their labels into `labels`, and appends each
/// item's [`Crop`] to `crops`: drawn by `aug` from `seed`, the item's epoch and position (the
/// draws the cropping path makes), or the whole image without `aug`. The items are split
/// between `augmenters.len()` threads as in [`write_batch`].
#[allow(clippy::too_many_arguments)]
pub fn write_padded(
    items: &[(ItemMeta, &[u8])],
    aug: Option<&RandomResizedCrop>,
    seed: u64,
    [ph, pw, pc]: [usize; 3],
    images: &mut [u8],
    labels: &mut [i64],
    crops: &mut Vec<Crop>,
    augmenters: &mut [Augmenter],
) -> Result<()> {
    let metas: Vec<ItemMeta> = items.iter().map(|i| i.0).collect();
    let [n, h, w, c] = padded_shape(&metas)?;
    if n == 0 {
        return Ok(());
    }
    let per = ph * pw * pc;
    if h > ph || w > pw || c != pc || images.len() < n * per || labels.len() < n {
        return Err(Error::Collate(format!(
            "padded output of {} bytes, {} labels, places {ph}x{pw}x{pc}, cannot hold {n} images up to {h}x{w}x{c}",
            images.len(),
            labels.len()
        )));
    }
    if let Some(a) = aug {
        a.validate()?;
    }
    let stream = per * n >= crate::copy::STREAM_THRESHOLD;
    split(
        items,
        &mut images[..n * per],
        per,
        augmenters,
        |_, (m, data), dst| {
            let (ih, iw) = image_size(m);
            if data.len() != ih as usize * iw as usize * c {
                return Err(Error::Collate(format!(
                    "element {} has {} bytes, not {ih}x{iw}x{c}",
                    m.element_id,
                    data.len()
                )));
            }
            place(data, (ih as usize, iw as usize), dst, (ph, pw, c), stream);
            Ok(())
        },
    )?;
    for (k, (m, _)) in items.iter().enumerate() {
        labels[k] = m.label;
        let (ih, iw) = image_size(m);
        crops.push(match aug {
            Some(a) => a.draw(ih, iw, crate::augment::item_key(seed, m.epoch, m.position)),
            None => Crop {
                image: (ih, iw),
                window: (0, 0, ih, iw),
                flip: false,
            },
        });
    }
    Ok(())
}

/// Rows and columns of an image item (padded_shape checked that it is one).
fn image_size(m: &ItemMeta) -> (u32, u32) {
    match m.format {
        Format::HwcU8 { height, width, .. } => (height, width),
        Format::Raw => (0, 0),
    }
}

/// Writes the `h × w × c` image `src` at the top left of `dst`, a `ph × pw × c` place: its
/// rows, then [`finish_place`].
pub(crate) fn place(
    src: &[u8],
    (h, w): (usize, usize),
    dst: &mut [u8],
    (ph, pw, c): (usize, usize, usize),
    stream: bool,
) {
    let (row, prow) = (w * c, pw * c);
    if w == pw {
        crate::copy::copy(&mut dst[..h * row], src, stream);
    } else {
        for (d, s) in dst.chunks_exact_mut(prow).zip(src.chunks_exact(row)) {
            d[..row].copy_from_slice(s);
        }
    }
    finish_place(dst, (h, w), (ph, pw, c));
}

/// Fills the padding of a place whose top left holds an `h × w` image: the image's last column
/// once more beside it and its last row once more below it (bilinear sampling at the image's
/// edge then reads the edge, as if clamped there, whatever the place's size), zeros beyond.
fn finish_place(dst: &mut [u8], (h, w): (usize, usize), (ph, pw, c): (usize, usize, usize)) {
    let prow = pw * c;
    if h == 0 || w == 0 {
        dst[..ph * prow].fill(0);
        return;
    }
    if w < pw {
        for r in dst[..h * prow].chunks_exact_mut(prow) {
            r.copy_within((w - 1) * c..w * c, w * c);
            r[(w + 1) * c..].fill(0);
        }
    }
    if h < ph {
        dst.copy_within((h - 1) * prow..h * prow, h * prow);
        dst[(h + 1) * prow..ph * prow].fill(0);
    }
}

/// Moves the first `crops.len()` places of a padded batch from `[H, W, C]` places to larger
/// `[H', W', C]` ones in place (a batch whose later records bring a larger image); `crops`
/// give the images' sizes.
pub fn restride_padded(images: &mut [u8], crops: &[Crop], from: [usize; 3], to: [usize; 3]) {
    let ([fh, fw, c], [th, tw, _]) = (from, to);
    let (fper, tper) = (fh * fw * c, th * tw * c);
    // Backwards, place by place and row by row: a row's new offset is at or after its old one,
    // and past the end of every row not yet moved, so nothing is overwritten before it moved.
    for (k, crop) in crops.iter().enumerate().rev() {
        let (h, w) = (crop.image.0 as usize, crop.image.1 as usize);
        for r in (0..h).rev() {
            let from_at = k * fper + r * fw * c;
            images.copy_within(from_at..from_at + w * c, k * tper + r * tw * c);
        }
        finish_place(&mut images[k * tper..(k + 1) * tper], (h, w), (th, tw, c));
    }
}

/// Threads a batch is augmented on by default: the cores, at most 8.
pub fn default_threads() -> usize {
    std::thread::available_parallelism()
        .map_or(1, |n| n.get())
        .min(8)
}

/// The buffer a whole batch is written into (at least `B·H·W·C` values).
#[derive(Debug)]
pub enum BatchOut<'a> {
    /// For [`Output::U8Nhwc`].
    U8(&'a mut [u8]),
    /// For [`Output::F32Nchw`].
    F32(&'a mut [f32]),
}

/// Writes `items` into `images` in `output`'s layout, each through `aug` when given
/// (randomness from `seed`, the item's epoch and position, so batch boundaries and threads
/// change nothing), and their labels into `labels`; returns the `[B, H, W, C]` shape. The
/// items are split between `augmenters.len()` threads (one per augmenter; one runs inline).
pub fn write_batch(
    items: &[(ItemMeta, &[u8])],
    aug: Option<&RandomResizedCrop>,
    seed: u64,
    output: &Output,
    images: BatchOut<'_>,
    labels: &mut [i64],
    augmenters: &mut [Augmenter],
) -> Result<[usize; 4]> {
    let metas: Vec<ItemMeta> = items.iter().map(|i| i.0).collect();
    let shape = match aug {
        Some(a) => {
            a.validate()?;
            augmented_shape(&metas, a)?
        }
        None => batch_shape(&metas)?,
    };
    let per = shape[1] * shape[2] * shape[3];
    if items.is_empty() {
        return Ok(shape);
    }
    if per == 0 {
        return imageless_labels(items, labels).map(|()| shape);
    }
    output.validate(shape[3] as u32)?;
    let have = match &images {
        BatchOut::U8(d) => d.len(),
        BatchOut::F32(d) => d.len(),
    };
    if have < per * items.len() || labels.len() < items.len() {
        return Err(Error::Collate(format!(
            "output too small: need {} image values and {} labels, got {have} and {}",
            per * items.len(),
            items.len(),
            labels.len()
        )));
    }
    if output.is_float() != matches!(images, BatchOut::F32(_)) {
        return Err(Error::Collate(format!(
            "the output buffer's type does not match the output layout {output:?}"
        )));
    }
    let stream = per * items.len() >= crate::copy::STREAM_THRESHOLD;
    let one = |a: &mut Augmenter, (meta, data): &(ItemMeta, &[u8]), dst: ItemOut<'_>| {
        let Format::HwcU8 {
            height,
            width,
            channels,
        } = meta.format
        else {
            return Err(Error::Collate(format!(
                "element {} is raw bytes; only HWC u8 images can be collated",
                meta.element_id
            )));
        };
        let key = crate::augment::item_key(seed, meta.epoch, meta.position);
        a.write(
            data,
            (height, width, channels),
            aug,
            key,
            output,
            dst,
            stream,
        )
    };
    match images {
        BatchOut::U8(d) => split(
            items,
            &mut d[..per * items.len()],
            per,
            augmenters,
            |a, it, d| one(a, it, ItemOut::U8(d)),
        )?,
        BatchOut::F32(d) => split(
            items,
            &mut d[..per * items.len()],
            per,
            augmenters,
            |a, it, d| one(a, it, ItemOut::F32(d)),
        )?,
    }
    for (k, (meta, _)) in items.iter().enumerate() {
        labels[k] = meta.label;
    }
    Ok(shape)
}

/// The labels of a batch of samples without an image (the caller copies their fields).
fn imageless_labels(items: &[(ItemMeta, &[u8])], labels: &mut [i64]) -> Result<()> {
    let have = labels.len();
    let Some(labels) = labels.get_mut(..items.len()) else {
        return Err(Error::Collate(format!(
            "output too small: need {} labels, got {have}",
            items.len()
        )));
    };
    for (l, (meta, _)) in labels.iter_mut().zip(items) {
        *l = meta.label;
    }
    Ok(())
}

/// Runs `f` on every item and its `per` values of `out`, the items split into contiguous
/// chunks, one per augmenter, on scoped threads (the first chunk on this thread).
fn split<T: Send>(
    items: &[(ItemMeta, &[u8])],
    out: &mut [T],
    per: usize,
    augmenters: &mut [Augmenter],
    f: impl Fn(&mut Augmenter, &(ItemMeta, &[u8]), &mut [T]) -> Result<()> + Sync,
) -> Result<()> {
    let threads = augmenters.len().clamp(1, items.len());
    let chunk = items.len().div_ceil(threads);
    let work = |a: &mut Augmenter, mine: &[(ItemMeta, &[u8])], out: &mut [T]| {
        mine.iter()
            .zip(out.chunks_mut(per))
            .try_for_each(|(it, d)| f(a, it, d))
    };
    if threads == 1 || augmenters.is_empty() {
        let mut fresh = Augmenter::default();
        let a = augmenters.first_mut().unwrap_or(&mut fresh);
        return work(a, items, out);
    }
    std::thread::scope(|s| {
        let mut parts = items
            .chunks(chunk)
            .zip(out.chunks_mut(per * chunk))
            .zip(augmenters.iter_mut());
        let first = parts.next();
        let handles: Vec<_> = parts
            .map(|((mine, o), a)| {
                // The thread counts where its parent does (a prefetch's stages).
                let sink = crate::stages::sink();
                s.spawn(move || {
                    if let Some(sink) = sink {
                        crate::stages::attach(sink, &crate::stages::client::COLLATE);
                    }
                    let r = work(a, mine, o);
                    // Before the scope ends: a scoped thread's own end may come after it.
                    crate::stages::detach();
                    r
                })
            })
            .collect();
        let mut result = first.map_or(Ok(()), |((mine, o), a)| work(a, mine, o));
        for h in handles {
            let r = h
                .join()
                .unwrap_or_else(|_| Err(Error::Collate("an augmentation thread panicked".into())));
            result = result.and(r);
        }
        result
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn meta(id: u32, h: u32, w: u32) -> ItemMeta {
        ItemMeta {
            element_id: id,
            label: id as i64 * 10,
            epoch: 0,
            position: id as u64,
            slot: id,
            generation: 1,
            format: Format::HwcU8 {
                height: h,
                width: w,
                channels: 3,
            },
            offset: 0,
            len: (h * w * 3) as u64,
            fields_len: 0,
            source: (0, 0),
        }
    }

    #[test]
    fn samples_without_an_image_collate_as_their_labels() {
        let fields_only = |id| ItemMeta {
            format: Format::Raw,
            len: 0,
            fields_len: 40,
            ..meta(id, 0, 0)
        };
        let items = vec![(fields_only(1), &[][..]), (fields_only(2), &[][..])];
        let metas: Vec<_> = items.iter().map(|i| i.0).collect();
        assert_eq!(batch_shape(&metas).unwrap(), [2, 0, 0, 0]);
        let mut labels = [0i64; 2];
        let mut augmenters = vec![Augmenter::default()];
        let shape = write_batch(
            &items,
            None,
            0,
            &Output::U8Nhwc,
            BatchOut::U8(&mut []),
            &mut labels,
            &mut augmenters,
        )
        .unwrap();
        assert_eq!(shape, [2, 0, 0, 0]);
        assert_eq!(labels, [10, 20]);
        let short = write_batch(
            &items,
            None,
            0,
            &Output::U8Nhwc,
            BatchOut::U8(&mut []),
            &mut labels[..1],
            &mut augmenters,
        );
        assert!(short.is_err());
        // A batch is all images or all samples without one; a crop needs images.
        let mixed = [fields_only(1), meta(2, 2, 2)];
        assert!(
            batch_shape(&mixed)
                .unwrap_err()
                .to_string()
                .contains("has no image")
        );
        assert!(batch_shape(&[meta(2, 2, 2), fields_only(1)]).is_err());
        let aug = RandomResizedCrop::new(2, 2);
        let e = augmented_shape(&metas, &aug).unwrap_err().to_string();
        assert!(e.contains("give its job no transform"), "{e}");
        // Raw bytes that are something (a `raw` pipeline's encoded image) still do not collate.
        let raw = ItemMeta {
            format: Format::Raw,
            ..meta(3, 2, 2)
        };
        assert!(batch_shape(&[raw]).is_err());
    }

    #[test]
    fn collates_contiguously() {
        let a = [1u8; 12];
        let b = [2u8; 12];
        let items = vec![(meta(1, 2, 2), &a[..]), (meta(2, 2, 2), &b[..])];
        let c = collate(&items).unwrap();
        assert_eq!(c.shape, [2, 2, 2, 3]);
        assert_eq!(&c.images[..12], &a[..]);
        assert_eq!(&c.images[12..], &b[..]);
        assert_eq!(c.labels, vec![10, 20]);
    }

    #[test]
    fn large_batches_use_streaming_copies_exactly() {
        // 4 × 1024×1024×3 = 12 MiB, above the streaming threshold.
        let imgs: Vec<Vec<u8>> = (0..4u32)
            .map(|k| {
                (0..3 << 20)
                    .map(|i: u32| (i.wrapping_mul(2654435761) >> 13) as u8 ^ k as u8)
                    .collect()
            })
            .collect();
        let items: Vec<_> = (0..4)
            .map(|k| (meta(k, 1024, 1024), &imgs[k as usize][..]))
            .collect();
        let mut out = vec![0u8; 12 << 20];
        let mut labels = vec![0i64; 4];
        assert!(out.len() >= crate::copy::STREAM_THRESHOLD);
        collate_into(&items, &mut out, &mut labels).unwrap();
        for k in 0..4 {
            assert!(
                out[k * (3 << 20)..(k + 1) * (3 << 20)] == imgs[k][..],
                "item {k}"
            );
        }
    }

    #[test]
    fn rejects_mixed_shapes_and_small_outputs() {
        let a = [1u8; 12];
        let b = [2u8; 27];
        let items = vec![(meta(1, 2, 2), &a[..]), (meta(2, 3, 3), &b[..])];
        assert_eq!(collate(&items).unwrap_err().code(), "collate");
        let items = vec![(meta(1, 2, 2), &a[..])];
        let mut out = vec![0u8; 11];
        let mut labels = vec![0i64; 1];
        assert!(collate_into(&items, &mut out, &mut labels).is_err());
    }

    /// The place a padded batch should hold for an `h × w` image: the image, its last column
    /// and row repeated once, zeros beyond.
    fn expected_place(img: &[u8], (h, w): (usize, usize), (ph, pw): (usize, usize)) -> Vec<u8> {
        let mut out = vec![0u8; ph * pw * 3];
        for y in 0..ph.min(h + 1) {
            for x in 0..pw.min(w + 1) {
                let (sy, sx) = (y.min(h - 1), x.min(w - 1));
                let at = (y * pw + x) * 3;
                out[at..at + 3].copy_from_slice(&img[(sy * w + sx) * 3..(sy * w + sx) * 3 + 3]);
            }
        }
        out
    }

    #[allow(clippy::too_many_lines, reason = "a test that reads straight through")]
    #[test]
    fn padded_batches_place_images_and_draw_as_the_crop_does() {
        let sizes = [(5u32, 7u32), (9, 4), (9, 7), (1, 1)];
        let imgs: Vec<Vec<u8>> = sizes
            .iter()
            .enumerate()
            .map(|(k, (h, w))| {
                (0..h * w * 3)
                    .map(|i| (i * 7 + k as u32 * 50 + 1) as u8)
                    .collect()
            })
            .collect();
        let items: Vec<_> = sizes
            .iter()
            .zip(&imgs)
            .enumerate()
            .map(|(k, ((h, w), img))| (meta(k as u32, *h, *w), &img[..]))
            .collect();
        let metas: Vec<ItemMeta> = items.iter().map(|i| i.0).collect();
        assert_eq!(padded_shape(&metas).unwrap(), [4, 9, 7, 3]);
        let aug = RandomResizedCrop::new(3, 3);
        for threads in [1, 3] {
            let mut augmenters: Vec<Augmenter> =
                (0..threads).map(|_| Augmenter::default()).collect();
            // Stale bytes from an earlier batch must not survive in the padding.
            let mut out = vec![0xAAu8; 4 * 9 * 7 * 3];
            let (mut labels, mut crops) = (vec![0i64; 4], Vec::new());
            let geometry = [9, 7, 3];
            write_padded(
                &items,
                Some(&aug),
                11,
                geometry,
                &mut out,
                &mut labels,
                &mut crops,
                &mut augmenters,
            )
            .unwrap();
            assert_eq!(labels, vec![0, 10, 20, 30]);
            for (k, ((h, w), img)) in sizes.iter().zip(&imgs).enumerate() {
                let (h, w) = (*h as usize, *w as usize);
                let place = &out[k * 189..(k + 1) * 189];
                assert_eq!(place, &expected_place(img, (h, w), (9, 7))[..], "item {k}");
                let key = crate::augment::item_key(11, 0, k as u64);
                assert_eq!(crops[k], aug.draw(h as u32, w as u32, key));
                assert_eq!(crops[k].image, (h as u32, w as u32));
            }
            // Grown places (a later record with a larger image): the same images, re-placed.
            let mut grown = out.clone();
            grown.resize(4 * 11 * 10 * 3, 0x55);
            restride_padded(&mut grown, &crops, [9, 7, 3], [11, 10, 3]);
            for (k, ((h, w), img)) in sizes.iter().zip(&imgs).enumerate() {
                let place = &grown[k * 330..(k + 1) * 330];
                assert_eq!(
                    place,
                    &expected_place(img, (*h as usize, *w as usize), (11, 10))[..],
                    "item {k}"
                );
            }
        }
        // Without augmentation the window is the whole image.
        let (mut out, mut labels, mut crops) = (vec![0u8; 4 * 189], vec![0i64; 4], Vec::new());
        write_padded(
            &items,
            None,
            0,
            [9, 7, 3],
            &mut out,
            &mut labels,
            &mut crops,
            &mut [],
        )
        .unwrap();
        assert_eq!(crops[1].window, (0, 0, 9, 4));
        assert!(!crops.iter().any(|c| c.flip));
        // Places smaller than an image are refused.
        let err = write_padded(
            &items,
            None,
            0,
            [8, 7, 3],
            &mut out,
            &mut labels,
            &mut crops,
            &mut [],
        );
        assert_eq!(err.unwrap_err().code(), "collate");
    }

    #[test]
    fn augmented_collate_is_deterministic_per_seed() {
        let img: Vec<u8> = (0..(32 * 40 * 3)).map(|i| (i % 251) as u8).collect();
        let items: Vec<_> = (0..5).map(|i| (meta(i, 32, 40), &img[..])).collect();
        let aug = RandomResizedCrop::new(16, 16);
        let mut o1 = vec![0u8; 5 * 16 * 16 * 3];
        let mut o2 = o1.clone();
        let mut o3 = o1.clone();
        let mut l = vec![0i64; 5];
        let shape = collate_augmented_into(&items, &aug, 7, &mut o1, &mut l).unwrap();
        assert_eq!(shape, [5, 16, 16, 3]);
        collate_augmented_into(&items, &aug, 7, &mut o2, &mut l).unwrap();
        collate_augmented_into(&items, &aug, 8, &mut o3, &mut l).unwrap();
        assert_eq!(o1, o2);
        assert_ne!(o1, o3);
        // Different positions get different crops even for the same image.
        assert_ne!(o1[..768], o1[768..1536]);
    }
}
