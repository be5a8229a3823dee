# The Python client of `joader bench e2e`: one `joader.Loader` job in its own process with the
# training recipe (the server caches each image resized to 256 on its shorter side; the client
# crops it with RandomResizedCrop(224) + flip on its prefetch thread).
# argv: server start end sleep_ms batch seed job; prints {"n", "first", "end", "startup", "cpu",
# "wait"} as JSON: n counts the samples after the first batch, timed from its arrival; "wait" is
# the time the loop spent waiting in next() after the first batch.
import json, resource, sys, time
import joader
t_imports = time.time()
url, start, end, sleep_ms = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4])
batch, seed, job = int(sys.argv[5]), int(sys.argv[6]), sys.argv[7]
loader = joader.Loader(server=url, dataset="d", job=job, batch_size=batch, subset={"start": start, "end": end},
                       epochs=1, seed=seed, pipeline={"kind": "decode", "resize_shorter": 256},
                       transform=joader.RandomResizedCrop(224))
it = iter(loader)
n, first, wait, cpu_first = 0, None, 0.0, 0.0
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
