# The PyTorch baseline of `joader bench e2e`, tuned as people run it: one DataLoader job over
# torchvision's ImageFolder, RandomResizedCrop(224) + RandomHorizontalFlip on the full images
# (the training recipe), persistent workers (as many as the bench says), one torch thread per
# worker.
# argv: root start end sleep_ms workers batch seed. Prints "ready" once imported and the
# dataset built (as joader's dataset is indexed before its jobs), then waits for "go" on stdin
# (the bench starts every job's clock alike, `import torch` left out), prints "progress N"
# after each batch (N samples so far: the bench starts staggered jobs by it), and last {"n",
# "n_first", "start", "first", "end", "cpu"} as JSON: `start` is "go", just before iter()
# starts the workers; n counts all the samples, n_first those of the first batch, whose end
# (its step included) is `first`; "cpu" is this process's and its workers' CPU time from
# `start` (read from /proc; the workers are born after it).
import json, os, sys, time
import torch, torchvision
from torchvision import transforms
from torch.utils.data import DataLoader, Subset
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


print("ready", flush=True)
if sys.stdin.readline().strip() != "go":
    sys.exit("the bench did not say go")
t_start = time.time()
cpu_start = cpu([os.getpid()])
n, n_first, first = 0, 0, None
it = iter(dl)
pids = [os.getpid()] + [w.pid for w in getattr(it, "_workers", [])]
for x, y in it:
    n += len(y)
    if sleep_ms:
        time.sleep(sleep_ms * len(y) / 1000)
    if first is None:
        first, n_first = time.time(), len(y)
    print(f"progress {n}", flush=True)
t_end = time.time()
used = cpu(pids) - cpu_start  # the persistent workers are still alive
print(json.dumps({"n": n, "n_first": n_first, "start": t_start, "first": first or t_end, "end": t_end, "cpu": used}),
      flush=True)
