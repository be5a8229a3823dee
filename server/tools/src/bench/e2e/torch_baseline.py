# The PyTorch baseline of `joader bench e2e`, tuned as people run it: one DataLoader job over
# torchvision's ImageFolder, RandomResizedCrop(224) + RandomHorizontalFlip on the full images
# (the training recipe), workers = cores, persistent, one torch thread per worker.
# argv: root start end sleep_ms workers batch seed; prints {"n", "first", "end", "startup", "cpu"}
# as JSON: n counts the samples after the first batch, timed from its arrival (time.time()),
# so that neither the interpreter's start-up nor `import torch` nor the workers' start count;
# "startup" is the time from after the imports to the first batch; "cpu" is this process's and
# its workers' CPU time over the same span (read from /proc).
import json, os, sys, time
import torch, torchvision
from torchvision import transforms
from torch.utils.data import DataLoader, Subset
t_imports = time.time()
root, start, end, sleep_ms = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4])
workers, batch, seed = int(sys.argv[5]), int(sys.argv[6]), int(sys.argv[7])
torch.set_num_threads(1)


def one_thread(_worker: int) -> None:
    torch.set_num_threads(1)


tf = transforms.Compose([transforms.RandomResizedCrop(224), transforms.RandomHorizontalFlip(), transforms.PILToTensor()])
ds = torchvision.datasets.ImageFolder(root, transform=tf)
dl = DataLoader(Subset(ds, range(start, end)), batch_size=batch, shuffle=True, num_workers=workers,
                persistent_workers=workers > 0, worker_init_fn=one_thread, generator=torch.Generator().manual_seed(seed))


def cpu(pids):
    tick, total = os.sysconf("SC_CLK_TCK"), 0.0
    for pid in pids:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        total += (int(fields[11]) + int(fields[12])) / tick
    return total


n, first, cpu_first, pids = 0, None, 0.0, []
it = iter(dl)
for x, y in it:
    if first is None:
        first = time.time()
        pids = [os.getpid()] + [w.pid for w in getattr(it, "_workers", [])]
        cpu_first = cpu(pids)
    else:
        n += len(y)
    if sleep_ms:
        time.sleep(sleep_ms * len(y) / 1000)
t_end = time.time()
used = cpu(pids) - cpu_first  # the persistent workers are still alive
print(json.dumps({"n": n, "first": first, "end": t_end, "startup": (first or t_end) - t_imports, "cpu": used}))
