# The Python client of `joader bench e2e`: one `joader.Loader` job in its own process with the
# training recipe (the server caches each image resized to 256 on its shorter side; the client
# crops it with RandomResizedCrop(224) + flip on its prefetch thread).
# argv: server start end sleep_ms batch seed job [warm]. Prints "ready" once imported, then
# waits for "go" on stdin (the bench starts every job's clock alike, imports left out), prints
# "progress N" after each batch (N samples so far: the bench starts staggered jobs by it), and
# last {"n", "n_first", "start", "first", "end", "cpu", "wait"} as JSON. With warm = 0 (the
# default) one epoch runs, timed from "go" (`start`, before the registration): n counts all
# its samples, n_first those of its first batch, `first` is the end of that batch (its step
# included), "cpu" is this process's CPU from `start` and "wait" the time the loop spent
# waiting in next() after the first batch. With warm = w > 0, w epochs run first without a
# step (they fill the server's cache) and epoch w + 1 is timed from its start (`start` =
# `first`, n_first = 0): "wait" and "cpu" cover all of it.
import json, resource, sys, time
import joader
url, start, end, sleep_ms = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4])
batch, seed, job = int(sys.argv[5]), int(sys.argv[6]), sys.argv[7]
warm = int(sys.argv[8]) if len(sys.argv) > 8 else 0


def cpu_now():
    ru = resource.getrusage(resource.RUSAGE_SELF)
    return ru.ru_utime + ru.ru_stime


print("ready", flush=True)
if sys.stdin.readline().strip() != "go":
    sys.exit("the bench did not say go")
t_start, cpu_start = time.time(), cpu_now()
loader = joader.Loader(server=url, dataset="d", job=job, batch_size=batch, subset={"start": start, "end": end},
                       epochs=warm + 1, seed=seed, pipeline={"kind": "decode", "resize_shorter": 256},
                       transform=joader.RandomResizedCrop(224))
for _ in range(warm):
    for _batch in loader:
        pass
n, n_first, first, wait = 0, 0, None, 0.0
if warm:
    t_start = first = time.time()
    cpu_start = cpu_now()
it = iter(loader)
while True:
    t = time.time()
    try:
        x, y = next(it)
    except StopIteration:
        break
    n += len(y)
    if first is not None:
        wait += time.time() - t
    if sleep_ms:
        time.sleep(sleep_ms * len(y) / 1000)
    if first is None:
        first, n_first = time.time(), len(y)
    print(f"progress {n}", flush=True)
t_end = time.time()
loader.close()
print(json.dumps({"n": n, "n_first": n_first, "start": t_start, "first": first or t_end, "end": t_end,
                  "cpu": cpu_now() - cpu_start, "wait": wait}), flush=True)
