# The PyTorch baseline of `joader bench e2e`: one DataLoader job over torchvision's ImageFolder.
# argv: root start end sleep_ms workers; prints {"n", "wall", "cpu"} as JSON.
import json, os, resource, sys, time
import torch, torchvision
from torchvision import transforms
from torch.utils.data import DataLoader, Subset
root, start, end, sleep_ms, workers = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4]), int(sys.argv[5])
torch.set_num_threads(1)
ds = torchvision.datasets.ImageFolder(root, transform=transforms.Compose([transforms.Resize(256), transforms.CenterCrop(224), transforms.PILToTensor()]))
dl = DataLoader(Subset(ds, range(start, end)), batch_size=16, shuffle=True, num_workers=workers)
t = time.time(); n = 0
for x, y in dl:
    n += len(y)
    if sleep_ms: time.sleep(sleep_ms * len(y) / 1000)
wall = time.time() - t
ru, rc = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
print(json.dumps({"n": n, "wall": wall, "cpu": ru.ru_utime + ru.ru_stime + rc.ru_utime + rc.ru_stime}))
