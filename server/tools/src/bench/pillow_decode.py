# Pillow's decode + resize(shorter side 256, bilinear) + center crop 224 on the same files,
# single-threaded, over whole passes for at least MIN_SECONDS; with draft() Pillow asks libjpeg
# for a DCT-scaled decode first (1/2, 1/4 or 1/8, keeping both sides >= 256).
# Usage: python3 pillow_decode.py plain|draft MIN_SECONDS FILE...
import io, json, sys, time
from PIL import Image

draft, min_seconds, paths = sys.argv[1] == "draft", float(sys.argv[2]), sys.argv[3:]
blobs = [open(p, "rb").read() for p in paths]


def one(b):
    im = Image.open(io.BytesIO(b))
    if draft:
        im.draft("RGB", (256, 256))
    im = im.convert("RGB")
    w, h = im.size
    s = 256 / min(w, h)
    im = im.resize((max(1, round(w * s)), max(1, round(h * s))), Image.BILINEAR)
    w, h = im.size
    l, t = (w - 224) // 2, (h - 224) // 2
    return im.crop((l, t, l + 224, t + 224)).tobytes()


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
