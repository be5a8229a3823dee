# Pillow's decode + resize(shorter side 256, bilinear) + center crop 224 on the same files,
# single-threaded, over whole passes for at least MIN_SECONDS. Modes:
# - plain: decode at full size, resize the whole image, crop;
# - draft: the same after draft(), which asks libjpeg for a DCT-scaled decode first (1/2, 1/4
#   or 1/8, keeping both sides >= 256);
# - tuned: Pillow at its best, as a user tuning it would write it: draft(), then one
#   resize(size, box=crop_box, reducing_gap=2.0) that computes only the kept pixels (Pillow's
#   own fused crop + resize; reducing_gap 2.0 is thumbnail()'s default: an integer reduce()
#   first where the remaining scale is 2x or more), on the decoded mode (a grayscale image is
#   resized as one channel and converted to RGB at 224x224).
# Usage: python3 pillow_decode.py plain|draft|tuned MIN_SECONDS FILE...
# With CHECK instead of MIN_SECONDS: prints, per file, the mean absolute difference between the
# mode's pixels and plain's.
import io, json, sys, time
from PIL import Image

mode, min_seconds, paths = sys.argv[1], sys.argv[2], sys.argv[3:]
blobs = [open(p, "rb").read() for p in paths]


def resized(w, h):
    s = 256 / min(w, h)
    return max(1, round(w * s)), max(1, round(h * s))


def plain(b, draft):
    im = Image.open(io.BytesIO(b))
    if draft:
        im.draft("RGB", (256, 256))
    im = im.convert("RGB")
    im = im.resize(resized(*im.size), Image.BILINEAR)
    w, h = im.size
    l, t = (w - 224) // 2, (h - 224) // 2
    return im.crop((l, t, l + 224, t + 224)).tobytes()


def tuned(b):
    im = Image.open(io.BytesIO(b))
    rw, rh = resized(*im.size)
    im.draft("RGB", (256, 256))
    if im.mode not in ("RGB", "L"):
        im = im.convert("RGB")
    # The crop in resized coordinates, as the plain mode cuts it, mapped onto the decoded image.
    l, t = (rw - 224) // 2, (rh - 224) // 2
    sx, sy = im.size[0] / rw, im.size[1] / rh
    box = (l * sx, t * sy, (l + 224) * sx, (t + 224) * sy)
    im = im.resize((224, 224), Image.BILINEAR, box=box, reducing_gap=2.0)
    return (im if im.mode == "RGB" else im.convert("RGB")).tobytes()


one = {"plain": lambda b: plain(b, False), "draft": lambda b: plain(b, True), "tuned": tuned}[mode]
if min_seconds == "CHECK":
    for p, b in zip(paths, blobs):
        x, y = one(b), plain(b, False)
        print(p, sum(abs(u - v) for u, v in zip(x, y)) / len(y))
    sys.exit(0)
min_seconds = float(min_seconds)
one(blobs[0])
n, t = 0, time.perf_counter()
while True:
    for b in blobs:
        one(b)
    n += len(blobs)
    secs = time.perf_counter() - t
    if secs >= min_seconds:
        break
print(json.dumps({"images_per_s": n / secs}))
