"""joader.torch with real torch (skipped with a message when torch is not installed, failed
under JOADER_REQUIRE_TOOLS=1: see conftest.need)."""

from __future__ import annotations

import numpy as np

import joader
from conftest import need, pattern
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
