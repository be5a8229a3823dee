# The array rows of `joader bench e2e --arrays`: one job in its own process reading one epoch
# of a `.npy` file's rows in batches, either through joader (`joader.Loader` over the server's
# `array` dataset `arr`: batch["x"] is the batch's rows stacked) or from the file with NumPy
# (`np.load(mmap_mode="r")`, each batch the rows of its own shuffled order: arr[perm[i:i+b]],
# one copy out of the page cache).
# argv: mode (joader | numpy) url_or_path batch seed job [sampler]. Prints "ready" once imported, waits
# for "go", prints "progress N" after each batch, then {"n", "n_first", "start", "first", "end",
# "cpu", "rss_anon", "rss_file"} as JSON: cpu is this process's from "go"; rss_anon and rss_file
# the largest RssAnon and RssFile (bytes) it had after a batch: what it held of its own and
# what it mapped of files (the page cache; the memmap's pages while it is open).
import json, resource, sys, time
import numpy as np

mode, where, batch, seed, job = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), sys.argv[5]
sampler = sys.argv[6] if len(sys.argv) > 6 else None
if mode == "joader":
    import joader


def cpu_now():
    ru = resource.getrusage(resource.RUSAGE_SELF)
    return ru.ru_utime + ru.ru_stime


def status(key):
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1]) * 1024
    return 0


def batches():
    if mode == "joader":
        loader = joader.Loader(server=where, dataset="arr", job=job, batch_size=batch, epochs=1, seed=seed,
                               sampler=sampler)
        for b in loader:
            yield b["x"]
        loader.close()
    else:
        arr = np.load(where, mmap_mode="r")
        perm = np.random.default_rng(seed).permutation(len(arr))
        for i in range(0, len(arr), batch):
            yield arr[perm[i:i + batch]]


print("ready", flush=True)
if sys.stdin.readline().strip() != "go":
    sys.exit("the bench did not say go")
t_start, cpu_start = time.time(), cpu_now()
n, n_first, first, check, rss_anon, rss_file = 0, 0, None, 0, 0, 0
for x in batches():
    rss_anon, rss_file = max(rss_anon, status("RssAnon")), max(rss_file, status("RssFile"))
    assert x.shape[1:] == (224, 224, 3) and x.dtype == np.uint8, (x.shape, x.dtype)
    n += len(x)
    check ^= int(x[:, 0, 0, 0].sum())  # the rows are read, not only mapped
    if first is None:
        first, n_first = time.time(), len(x)
    print(f"progress {n}", flush=True)
t_end = time.time()
print(json.dumps({"n": n, "n_first": n_first, "start": t_start, "first": first or t_end, "end": t_end,
                  "cpu": cpu_now() - cpu_start, "rss_anon": rss_anon, "rss_file": rss_file}),
      flush=True)
