"""joader.torch with real torch (skipped with a message when torch is not installed, failed
under JOADER_REQUIRE_TOOLS=1: see conftest.need)."""

from __future__ import annotations

import numpy as np
import pytest

import joader
from conftest import CUDA, DEVICES, need, pattern
from test_loader import FakeServer, registration


def test_iterable_dataset_with_dataloader(writer):
    torch = need("torch", "the PyTorch adapter test needs it; ci.sh installs it")
    from joader.torch import JoaderDataset

    w = writer(rings="tr", elements=10, height=4, width=5, epochs=2)
    srv = FakeServer((200, registration(w.instance, "tr")))
    try:
        ds = JoaderDataset(server=srv.url, dataset="d", job="tr", batch_size=4, channels_first=True)
        dl = torch.utils.data.DataLoader(ds, batch_size=None)
        for _epoch in range(2):
            seen = []
            for x, y in dl:
                assert isinstance(x, torch.Tensor) and x.dtype == torch.uint8
                assert x.shape[1:] == (3, 4, 5)
                assert y.dtype == torch.int64
                for img, lab in zip(x, y):
                    ref = pattern(int(lab) - 1000, (4, 5, 3)).transpose(2, 0, 1)
                    assert np.array_equal(img.numpy(), ref)
                    seen.append(int(lab))
            assert sorted(seen) == list(range(1000, 1010))
        ds.close()
    finally:
        srv.close()


# Page-locked memory needs a GPU: defined only where one is present (the test command
# treats a skipped test as a failure, and CI never has a GPU).
if CUDA:
    @pytest.mark.parametrize("shape,dims", [((3, 5, 6, 3), (0, 3, 1, 2)), ((4, 3), (0, 1)), ((2, 3, 4), (2, 0, 1))])
    def test_pinned_copies_keep_shape_strides_and_values(shape, dims):
        torch = need("torch", "the PyTorch adapter test needs it")
        from joader.torch import pinned

        for dtype in (torch.uint8, torch.float32, torch.int64):
            base = (torch.arange(int(np.prod(shape))) % 251).to(dtype).reshape(shape)
            for t in (base, base.permute(*dims), base[..., ::2]):
                p = pinned(t)
                assert p.is_pinned() and p.shape == t.shape and torch.equal(p, t)
                if t.is_contiguous() or t.permute(*np.argsort(t.stride())[::-1].tolist()).is_contiguous():
                    assert p.stride() == t.stride()
                assert p.data_ptr() != t.data_ptr()


@pytest.mark.parametrize("device", DEVICES)
def test_pinned_batches_reach_the_device_intact(writer, device):
    torch = need("torch", "the PyTorch adapter test needs it")
    from joader.torch import JoaderDataset

    # pin_memory=True with CUDA: every batch in page-locked memory, copied without blocking; the
    # next batches are read (and the pool's buffers reused) while earlier copies may be in flight.
    w = writer(rings="pm", elements=24, height=6, width=7, epochs=2)
    srv = FakeServer((200, registration(w.instance, "pm")))
    try:
        ds = JoaderDataset(server=srv.url, dataset="d", job="pm", batch_size=4, channels_first=True,
                           pin_memory=device == "cuda")
        for _epoch in range(2):
            held = []
            for x, y in ds:
                assert x.is_pinned() == (device == "cuda")
                held.append((x.to(device, non_blocking=True, copy=True), y.to(device, non_blocking=True, copy=True)))
            if device == "cuda":
                torch.cuda.synchronize()
            seen = []
            for x, y in held:
                assert x.device.type == device
                for img, lab in zip(x.cpu(), y.cpu()):
                    ref = pattern(int(lab) - 1000, (6, 7, 3)).transpose(2, 0, 1)
                    assert np.array_equal(img.numpy(), ref)
                    seen.append(int(lab))
            assert sorted(seen) == list(range(1000, 1024))
        ds.close()
    finally:
        srv.close()
