# The Python client of `joader bench e2e`: one `joader.Loader` job in its own process with the
# training recipe (the server caches each image resized to 256 on its shorter side; the client
# crops it with RandomResizedCrop(224) + flip on its prefetch thread).
# argv: server start end sleep_ms batch seed job [warm]; prints {"n", "first", "end", "startup",
# "cpu", "wait"} as JSON. With warm = 0 (the default) one epoch runs and is timed from the
# arrival of its first batch: n counts the samples after it and "wait" is the time the loop
# spent waiting in next() after it. With warm = w > 0, w epochs run first without a step (they
# fill the server's cache) and epoch w + 1 is timed from its start: n counts all its samples
# and "wait" every next() of it, the first included.
import json, resource, sys, time
import joader
t_imports = time.time()
url, start, end, sleep_ms = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4])
batch, seed, job = int(sys.argv[5]), int(sys.argv[6]), sys.argv[7]
warm = int(sys.argv[8]) if len(sys.argv) > 8 else 0
loader = joader.Loader(server=url, dataset="d", job=job, batch_size=batch, subset={"start": start, "end": end},
                       epochs=warm + 1, seed=seed, pipeline={"kind": "decode", "resize_shorter": 256},
                       transform=joader.RandomResizedCrop(224))
for _ in range(warm):
    for _batch in loader:
        pass
n, first, wait, cpu_first = 0, None, 0.0, 0.0
if warm:
    first = time.time()
    ru = resource.getrusage(resource.RUSAGE_SELF)
    cpu_first = ru.ru_utime + ru.ru_stime
it = iter(loader)
while True:
    t = time.time()
    try:
        x, y = next(it)
    except StopIteration:
        break
    now = time.time()
    if first is None:
        first = now
        ru = resource.getrusage(resource.RUSAGE_SELF)
        cpu_first = ru.ru_utime + ru.ru_stime
    else:
        wait += now - t
        n += len(y)
    if sleep_ms:
        time.sleep(sleep_ms * len(y) / 1000)
t_end = time.time()
loader.close()
ru = resource.getrusage(resource.RUSAGE_SELF)
print(json.dumps({"n": n, "first": first, "end": t_end, "startup": (first or t_end) - t_imports,
                  "cpu": ru.ru_utime + ru.ru_stime - cpu_first, "wait": wait}))
