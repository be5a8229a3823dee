"""The device path: padded batches with the native crop draws (``Loader(padded=True)``), and
``joader.torch``'s batched crop, flip and normalization (`augment_padded`), run on the CPU
here and compared with the native (CPU) augmentation."""

from __future__ import annotations

import dataclasses
from typing import Any, List, Tuple

import numpy as np
import pytest

import joader
from conftest import DEVICES, need, pattern
from test_loader import FakeServer, registration

MEAN, STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)


def test_padded_loader_hands_over_the_images_and_the_native_draws(writer):
    w = writer(rings="p", elements=5, height=6, width=9, epochs=2)
    reg = registration(w.instance, "p", rank=1, world=2)
    reg["job"]["subset_size"] = 12  # a share of 6 per rank: this ring's 5 are padded by one
    srv = FakeServer((200, reg))
    aug = joader.RandomResizedCrop((3, 4))
    try:
        loader = joader.Loader(server=srv.url, dataset="d", job="p", batch_size=4, seed=7, transform=aug,
                               rank=1, world_size=2, padded=True, mean=MEAN, std=STD)
        assert loader.mean == MEAN and loader.std == STD
        for epoch in range(2):
            got: List[Tuple[int, Any, Any, bool]] = []
            for batch, labels in loader:
                assert isinstance(batch, joader.Padded) and len(batch) == len(labels)
                assert batch.pixels.dtype == np.uint8 and batch.pixels.shape[1:] == (6, 9, 3)
                assert (batch.height, batch.width) == (3, 4)
                positions = loader.last_positions
                for k, lab in enumerate(labels):
                    np.testing.assert_array_equal(batch.pixels[k], pattern(int(lab) - 1000, (6, 9, 3)))
                    assert tuple(batch.sizes[k]) == (6, 9)
                    top, left, h, wd, flip = aug.draw(6, 9, seed=7, epoch=epoch, position=int(positions[k]))
                    assert tuple(batch.boxes[k]) == (top, left, h, wd) and bool(batch.flips[k]) == flip
                    got.append((int(lab), tuple(batch.boxes[k]), bool(batch.flips[k]), int(positions[k])))
            assert len(got) == 6, f"epoch {epoch}: {got}"
            # The padding repeats the epoch's first element, its draws included.
            assert got[-1] == got[0]
        loader.close()
    finally:
        srv.close()


def test_padded_needs_a_crop():
    with pytest.raises(ValueError, match="padded=True needs"):
        joader.Loader(server="http://x", dataset="d", batch_size=1, padded=True)


def _photos() -> List[np.ndarray]:
    """Real photos as the server caches them (shorter side 256, antialiased), in three sizes."""
    datasets = need("sklearn.datasets", "real photos (load_sample_images) for the device path's accuracy test")
    torch = need("torch", "the device path is torch code")
    out = []
    for a in datasets.load_sample_images().images:
        h, w = a.shape[:2]
        s = 256 / min(h, w)
        t = torch.from_numpy(np.array(a)).permute(2, 0, 1)[None].float()
        t = torch.nn.functional.interpolate(t, size=(round(h * s), round(w * s)), mode="bilinear",
                                            antialias=True, align_corners=False)
        out.append(t[0].round().clamp(0, 255).to(torch.uint8).permute(1, 2, 0).contiguous().numpy())
    # A portrait one and a narrower one: a batch of different sizes, as a real dataset's.
    out.append(np.ascontiguousarray(out[0].transpose(1, 0, 2)))
    out.append(np.ascontiguousarray(out[1][:, 20:320]))
    return out


def _pad(images: List[np.ndarray], aug: joader.RandomResizedCrop, seed: int, epoch: int,
         positions: List[int]) -> joader.Padded:
    """The padded batch the native prefetch hands over (layout as `joader.Padded` documents)."""
    hmax = max(i.shape[0] for i in images)
    wmax = max(i.shape[1] for i in images)
    pixels = np.zeros((len(images), hmax, wmax, 3), np.uint8)
    boxes, flips = [], []
    for k, (im, p) in enumerate(zip(images, positions)):
        h, w = im.shape[:2]
        pixels[k, :h, :w] = im
        pixels[k, :h, w:w + 1] = im[:, w - 1:w]
        pixels[k, h:h + 1, :w + 1] = pixels[k, h - 1:h, :w + 1]
        top, left, ch, cw, flip = aug.draw(h, w, seed, epoch, p)
        boxes.append((top, left, ch, cw))
        flips.append(flip)
    sizes = np.array([i.shape[:2] for i in images], np.int64)
    return joader.Padded(pixels, sizes, np.array(boxes, np.int64), np.array(flips), aug.height, aug.width)


@pytest.mark.parametrize("device", DEVICES)
def test_device_augmentation_follows_the_native_one_on_photos(device):
    torch = need("torch", "the device path is torch code")
    need("torchvision", "the device path crops with torchvision.ops.roi_align")
    from joader.torch import augment_padded

    # On CUDA through page-locked memory and non-blocking copies, as a training loop runs it.
    pin = device == "cuda"

    def on(batch: joader.Padded, *args: Any, **kw: Any) -> Any:
        out = augment_padded(batch, device, *args, pin_memory=pin, **kw)
        assert out.device.type == device
        return out.cpu()

    photos = _photos()
    aug = joader.RandomResizedCrop(224)
    seed, epoch, worst, flipped = 11, 2, 0.0, 0
    for first in range(0, 96, 8):
        positions = list(range(first, first + 8))
        images = [photos[p % len(photos)] for p in positions]
        batch = _pad(images, aug, seed, epoch, positions)
        flipped += int(batch.flips.sum())
        u8 = on(batch)
        f32 = on(batch, MEAN, STD)
        chw = on(batch, channels_first=True)
        assert u8.dtype == torch.uint8 and u8.shape == (8, 224, 224, 3)
        assert f32.dtype == torch.float32 and f32.shape == (8, 3, 224, 224)
        assert torch.equal(chw, u8.permute(0, 3, 1, 2))
        for k, (im, p) in enumerate(zip(images, positions)):
            ref = aug.apply(im, seed=seed, epoch=epoch, position=p).astype(np.float64)
            d_u8 = np.abs(u8[k].numpy().astype(np.float64) - ref).mean()
            # The float output in levels: back through the normalization.
            levels = (f32[k].numpy().transpose(1, 2, 0) * np.array(STD) + np.array(MEAN)) * 255
            d_f32 = np.abs(levels - ref).mean()
            worst = max(worst, d_u8, d_f32)
            assert d_u8 <= 2 and d_f32 <= 2, f"position {p}: {d_u8:.3f} / {d_f32:.3f} levels"
    assert 0 < flipped < 96
    print(f"device {device}: worst mean difference from the native crop {worst:.3f} levels (bound 2)")
    # Wrong draws are far off: the bound above tells a right crop from a wrong one.
    batch = _pad([photos[0]], aug, seed, epoch, [0])
    wrong = dataclasses.replace(batch, boxes=batch.boxes[:, [1, 0, 2, 3]] // 2, flips=~batch.flips)
    ref = aug.apply(photos[0], seed=seed, epoch=epoch, position=0).astype(np.float64)
    assert np.abs(on(wrong)[0].numpy() - ref).mean() > 10 > 2


@pytest.mark.parametrize("device", DEVICES)
def test_dataset_on_device_equals_the_native_path(writer, device):
    torch = need("torch", "the device path is torch code")
    need("torchvision", "the device path crops with torchvision.ops.roi_align")
    from joader.torch import JoaderDataset

    # The rings of one writer get the same elements at the same positions. A crop of the whole
    # 4x5 image to 4x5 is a copy, so both paths must agree exactly, flips included.
    w = writer(rings="n,g,m,h", elements=10, height=4, width=5, epochs=2)
    aug = joader.RandomResizedCrop((4, 5), scale=(1.0, 1.0), ratio=(1.25, 1.25))
    servers = {r: FakeServer((200, registration(w.instance, r))) for r in ("n", "g", "m", "h")}
    try:
        for (ring_n, ring_d), (mean, std), first in ((("n", "g"), (MEAN, STD), False), (("m", "h"), (None, None), True)):
            common: Any = dict(dataset="d", batch_size=4, transform=aug, seed=5, mean=mean, std=std,
                               channels_first=first)
            native = JoaderDataset(server=servers[ring_n].url, job=ring_n, **common)
            on = JoaderDataset(server=servers[ring_d].url, job=ring_d, device=device, pin_memory=device == "cuda",
                               **common)
            flips = []
            for epoch in range(2):
                n = 0
                for (xn, yn), (xd, yd) in zip(native, on):
                    assert xd.dtype == xn.dtype and xd.shape == xn.shape and xd.device.type == device
                    assert yd.device.type == device
                    xd, yd = xd.cpu(), yd.cpu()
                    assert torch.equal(yn, yd)
                    assert torch.allclose(xn.float(), xd.float(), atol=1e-5)
                    flips += [aug.draw(4, 5, 5, epoch, int(p))[4] for p in on.loader.last_positions]
                    n += len(yd)
                assert n == 10
            assert any(flips) and not all(flips)
            native.close()
            on.close()
    finally:
        for s in servers.values():
            s.close()


def test_device_needs_a_native_crop_or_none():
    need("torch", "the device path is torch code")
    from joader.torch import JoaderDataset

    with pytest.raises(ValueError, match="device= needs"):
        JoaderDataset(server="http://x", dataset="d", batch_size=1, device="cpu", transform=lambda x, y: (x, y))
