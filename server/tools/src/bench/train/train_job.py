# One training job of `joader bench train`, in its own process; or, with role "monitor", the GPU
# utilization sampler (NVML through pynvml).
#
# argv[1] is a JSON object: role ("job" or "monitor"), system ("synthetic", "joader",
# "joader-device", "pytorch"), model (a torchvision model name, or "tiny": a small conv net defined here), batch,
# classes, seed, job (its name), server (joader's URL), root (the ImageFolder), workers (the
# DataLoader's), threads (torch's CPU threads without CUDA: the bench gives 1), cuda (train on the GPU: bf16
# autocast, channels_last), gpu (the NVML index of the monitor).
#
# A job imports torch, builds its model (and, for pytorch, its ImageFolder and DataLoader) and
# prints "ready"; it waits for "go" on stdin (so that no import falls in another job's time),
# then trains until it reads "stop" (or its stdin ends), printing after each step one JSON line
# {"step", "images", "t", "stage"}: the steps and images so far, the wall clock after the step
# (on CUDA after a synchronize, so that the step's kernels are done), and the client's CPU by
# stage (`Loader.stage_cpu()`) where the joader package has it (else null). It ends with
# {"done": true, "steps", "images"}. Every system normalizes uint8 batches on the
# device, as the README's training recipe does with pin_memory.
#
# The monitor prints "ready" once NVML answers (else one line {"nvml": "why"} and exits), then
# {"t", "gpu"} every 100 ms (the device's utilization, percent) until its stdin ends.
import json
import os
import sys
import threading
import time

cfg = json.loads(sys.argv[1])


def monitor() -> None:
    try:
        import pynvml
        pynvml.nvmlInit()
        handle = pynvml.nvmlDeviceGetHandleByIndex(int(cfg.get("gpu", 0)))
        pynvml.nvmlDeviceGetUtilizationRates(handle)
    except Exception as e:  # no pynvml, no driver: the bench prints n/a
        print(json.dumps({"nvml": f"{type(e).__name__}: {e}"}), flush=True)
        return
    print("ready", flush=True)
    ended = threading.Event()
    threading.Thread(target=lambda: (sys.stdin.read(), ended.set()), daemon=True).start()
    while not ended.wait(0.1):
        print(json.dumps({"t": time.time(), "gpu": pynvml.nvmlDeviceGetUtilizationRates(handle).gpu}), flush=True)


if cfg["role"] == "monitor":
    monitor()
    sys.exit(0)

import gc  # noqa: E402

import torch  # noqa: E402
import torchvision  # noqa: E402
from torch import nn  # noqa: E402

system, batch, classes, seed = cfg["system"], int(cfg["batch"]), int(cfg["classes"]), int(cfg["seed"])
cuda = bool(cfg["cuda"])
device = torch.device("cuda" if cuda else "cpu")
if not cuda:
    torch.set_num_threads(int(cfg["threads"]))
torch.manual_seed(seed)


def tiny(n: int) -> nn.Module:
    """The CPU model: a 4x4 patch stem, two strided convolutions and a linear layer (about 6k
    parameters, 3 M multiply-adds per image), light enough that loading shows on a CPU."""
    def block(i: int, o: int, k: int, s: int) -> list:
        return [nn.Conv2d(i, o, k, stride=s, padding=k // 2 if s == 2 else 0, bias=False), nn.BatchNorm2d(o),
                nn.ReLU(inplace=True)]
    return nn.Sequential(*block(3, 8, 4, 4), *block(8, 16, 3, 2), *block(16, 32, 3, 2), nn.AdaptiveAvgPool2d(1),
                         nn.Flatten(), nn.Linear(32, n))


model = tiny(classes) if cfg["model"] == "tiny" else torchvision.models.get_model(cfg["model"], weights=None,
                                                                                  num_classes=classes)
model = model.to(device)
if cuda:
    model = model.to(memory_format=torch.channels_last)
    torch.backends.cudnn.benchmark = True
opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
mean = torch.tensor([0.485, 0.456, 0.406], device=device).view(1, 3, 1, 1) * 255
std = torch.tensor([0.229, 0.224, 0.225], device=device).view(1, 3, 1, 1) * 255
# joader and the synthetic batch are NHWC, DataLoader's PILToTensor NCHW.
nhwc = system != "pytorch"

if system == "pytorch":
    from torch.utils.data import DataLoader
    from torchvision import transforms

    def one_thread(_worker: int) -> None:
        torch.set_num_threads(1)

    tf = transforms.Compose([transforms.RandomResizedCrop(224), transforms.RandomHorizontalFlip(),
                             transforms.PILToTensor()])
    workers = int(cfg["workers"])
    loader = DataLoader(torchvision.datasets.ImageFolder(cfg["root"], transform=tf), batch_size=batch, shuffle=True,
                        num_workers=workers, persistent_workers=workers > 0, pin_memory=cuda,
                        prefetch_factor=4 if workers > 0 else None, drop_last=True, worker_init_fn=one_thread,
                        generator=torch.Generator().manual_seed(seed))
elif system == "synthetic":
    g = torch.Generator().manual_seed(seed)
    ready_x = torch.randint(0, 256, (batch, 224, 224, 3), dtype=torch.uint8, generator=g)
    ready_y = torch.randint(0, classes, (batch,), generator=g)
    if cuda:
        ready_x, ready_y = ready_x.pin_memory(), ready_y.pin_memory()
elif system not in ("joader", "joader-device"):
    sys.exit(f"unknown system {system!r}")

print("ready", flush=True)
if sys.stdin.readline().strip() != "go":
    sys.exit("the bench did not say go")
stop = threading.Event()


def watch_stdin() -> None:
    # The raw descriptor, not sys.stdin: a thread blocked in sys.stdin holds its lock, and a
    # DataLoader worker forked meanwhile closes sys.stdin as it starts, waiting for that lock
    # forever.
    said = b""
    while b"stop" not in said:
        chunk = os.read(0, 64)
        if not chunk:
            break
        said += chunk
    stop.set()


threading.Thread(target=watch_stdin, daemon=True).start()

ds = None
if system in ("joader", "joader-device"):
    import joader
    import joader.torch
    # joader-device: padded uint8 batches go to the device, which crops, flips and resizes them.
    ds = joader.torch.JoaderDataset(server=cfg["server"], dataset="d", job=cfg["job"], batch_size=batch, seed=seed,
                                    epochs=None, pipeline={"kind": "decode", "resize_shorter": 256},
                                    transform=joader.RandomResizedCrop(224), prefetch=int(cfg["prefetch"]),
                                    ring_capacity=cfg["ring_capacity"], pin_memory=cuda,
                                    device=device if system == "joader-device" else None)


it = None


def next_batch():
    """The next batch, epoch after epoch."""
    global it
    if system == "synthetic":
        return ready_x, ready_y
    while True:
        if it is None:
            it = iter(loader if system == "pytorch" else ds)
        try:
            return next(it)
        except StopIteration:
            it = None


def stage_cpu():
    f = getattr(ds.loader, "stage_cpu", None) if ds is not None else None
    if not callable(f):
        return None
    return {str(k): float(v) for k, v in dict(f()).items() if isinstance(v, (int, float))}


steps = images = 0
while not stop.is_set():
    x, y = next_batch()
    x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
    if nhwc:
        x = x.permute(0, 3, 1, 2)  # a view: NCHW in channels_last memory
    x = (x.float() - mean) / std
    if cuda:
        x = x.contiguous(memory_format=torch.channels_last)
    with torch.autocast("cuda", dtype=torch.bfloat16, enabled=cuda):
        loss = nn.functional.cross_entropy(model(x), y)
    opt.zero_grad(set_to_none=True)
    loss.backward()
    opt.step()
    if cuda:
        torch.cuda.synchronize()
    steps += 1
    images += len(y)
    print(json.dumps({"step": steps, "images": images, "t": time.time(), "stage": stage_cpu()}), flush=True)

if ds is not None:
    ds.close()
# DataLoader's persistent workers are shut down when the last reference to its iterator goes
# (the loader keeps one), before the process ends and not by the interpreter's exit.
it = loader = None
gc.collect()
print(json.dumps({"done": True, "steps": steps, "images": images}), flush=True)
