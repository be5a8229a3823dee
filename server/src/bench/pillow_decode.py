# Pillow's decode + resize(shorter side 256, bilinear) + center crop 224 on the same files,
# single-threaded; with draft() Pillow asks libjpeg for a DCT-scaled decode first.
import json, sys, time
from PIL import Image
paths, draft = sys.argv[2:], sys.argv[1] == "draft"
blobs = [open(p, "rb").read() for p in paths]
import io
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
t = time.perf_counter()
for b in blobs:
    one(b)
print(json.dumps({"images_per_s": len(blobs) / (time.perf_counter() - t)}))
