"""Where a `joader bench train` run waits: polls the bench's `joader serve` child while it runs.

    python3 probe.py OUT.txt [INTERVAL_S]

Finds the newest `joader serve` of the bench (its `--instance bench_scale_train_*`) and the port
it listens on (its sockets in /proc/net/tcp), then every INTERVAL_S (default 0.1 s) reads its
`/metrics` and `/v1/jobs`, and the CPU of its threads and of the job processes' threads
(/proc). While a job runs it writes one line per sample to OUT.txt; when the server is gone (the
run ended) it appends a summary: the means and spread of the Cache's pending loads, the
Loader's queue, the payloads waiting for room, the records between the server and the training
loop (sampled - acknowledged), the decode rate, the busy loader threads, the fraction of time
the job's client waited on an empty ring (`stall_s`), and each process's CPU by thread name.
Needs nothing beyond the standard library.
"""

import json
import os
import re
import statistics
import sys
import time
import urllib.request

HZ = os.sysconf("SC_CLK_TCK")
GAUGES = ("joader_cache_pending_loads", "joader_cache_waiting_payloads", "joader_loader_queue_depth",
          "joader_cache_slots_in_use", "joader_cache_slots_capacity", "joader_decodes_total")


def server_pid():
    best = None
    for p in os.listdir("/proc"):
        if not p.isdigit():
            continue
        try:
            cmd = open(f"/proc/{p}/cmdline", "rb").read().split(b"\0")
        except OSError:
            continue
        if b"serve" in cmd and any(a.startswith(b"bench_scale_train") for a in cmd):
            best = max(best or 0, int(p))
    return best


def listen_port(pid):
    inodes = set()
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            link = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        m = re.match(r"socket:\[(\d+)\]", link)
        if m:
            inodes.add(m.group(1))
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = open(table).read().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            f = line.split()
            if f[3] == "0A" and (f[9] in inodes or not inodes):
                port = int(f[1].rsplit(":", 1)[1], 16)
                if probe_port(port):
                    return port
    return None


def probe_port(port):
    try:
        return b"joader_build_info" in get(port, "/metrics")
    except OSError:
        return False


def get(port, path):
    with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=2) as r:
        return r.read()


def gauges(text):
    out = {}
    for line in text.decode().splitlines():
        for g in GAUGES:
            if line.startswith(g) and (len(line) == len(g) or line[len(g)] in " {"):
                out[g] = out.get(g, 0.0) + float(line.rsplit(" ", 1)[1])
    return out


def tasks(pid):
    """(thread id, thread name, CPU seconds) of each thread of a process (/proc)."""
    try:
        ids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return []
    out = []
    for t in ids:
        try:
            stat = open(f"/proc/{pid}/task/{t}/stat").read()
        except OSError:
            continue
        rest = stat[stat.rindex(")") + 2:].split()
        out.append((t, stat[stat.index("(") + 1:stat.rindex(")")], (int(rest[11]) + int(rest[12])) / HZ))
    return out


def threads_cpu(pid):
    """{thread name: CPU seconds} of one process (threads of one name but a number added)."""
    out = {}
    for _, name, cpu in tasks(pid):
        name = re.sub(r"\d+$", "#", name)
        out[name] = out.get(name, 0.0) + cpu
    return out


def job_pids():
    pids = []
    for p in os.listdir("/proc"):
        if p.isdigit():
            try:
                cmd = open(f"/proc/{p}/cmdline", "rb").read()
            except OSError:
                continue
            if b"One training job of `joader bench train`" in cmd and b'"role":"job"' in cmd:
                pids.append(int(p))
    return pids


def loader_threads_cpu(pid):
    """{thread id: CPU seconds} of the server's loader threads (to count the busy ones)."""
    return {t: cpu for t, name, cpu in tasks(pid) if name.startswith("joader-loader")}


def main():
    out_path = sys.argv[1]
    interval = float(sys.argv[2]) if len(sys.argv) > 2 else 0.1
    out = open(out_path, "a")
    while True:  # one bench run after another (K = 1, then the next), until killed
        pid = port = None
        while port is None:
            pid = server_pid()
            if pid:
                try:
                    port = listen_port(pid)
                except OSError:
                    port = None
            if port is None:
                time.sleep(0.2)
        out.write(f"# server pid {pid} port {port}\n")
        samples, t0 = [], time.monotonic()
        # CPU by thread name of the server and of the job processes (found once, when the
        # first job runs): at the first running sample, and at the latest.
        jobs, cpu0, cpu1, jcpu0, jcpu1 = [], {}, {}, {}, {}
        last_busy, last_t, last_dec = loader_threads_cpu(pid), t0, None
        while os.path.exists(f"/proc/{pid}"):
            time.sleep(interval)
            try:
                g = gauges(get(port, "/metrics"))
                views = json.loads(get(port, "/v1/jobs"))["jobs"]
            except (OSError, ValueError, KeyError):
                continue
            now = time.monotonic()
            busy = loader_threads_cpu(pid)
            dt = now - last_t
            busy_n = sum(min(1.0, (busy[t] - last_busy.get(t, busy[t])) / dt) for t in busy)
            last_busy, last_t = busy, now
            running = [j for j in views if j["state"] == "running"]
            if not running:
                continue
            if not samples:
                jobs = job_pids()
                cpu0, jcpu0 = threads_cpu(pid), {p: threads_cpu(p) for p in jobs}
            dec = g.get("joader_decodes_total", 0.0)
            rate = (dec - last_dec) / dt if last_dec is not None else float("nan")
            last_dec = dec
            inflight = sum(j["sampled"] - j["acknowledged"] for j in running)
            s = (now - t0, g.get("joader_cache_pending_loads", 0), g.get("joader_loader_queue_depth", 0),
                 g.get("joader_cache_waiting_payloads", 0), g.get("joader_cache_slots_in_use", 0), inflight,
                 rate, busy_n, sum(j["stall_s"] for j in running), sum(j["acknowledged"] for j in running))
            samples.append(s)
            out.write("t %.2f pending %d queue %d waiting %d slots %d inflight %d decodes/s %.0f busy_loaders %.1f "
                      "stall_s %.3f acked %d\n" % s)
            cpu1 = threads_cpu(pid)
            for p in jobs:  # a job that has ended keeps its last reading
                jcpu1[p] = threads_cpu(p) or jcpu1.get(p, {})
        summary(out, samples, cpu0, cpu1, jcpu0, jcpu1)
        out.flush()


def summary(out, samples, cpu0, cpu1, jcpu0, jcpu1):
    if len(samples) < 3:
        out.write("# too few samples\n")
        return
    # The middle of the run: the first and last fifth (start, warm-up, the end) left out.
    n = len(samples)
    mid = samples[n // 5: n - n // 5] or samples
    span = mid[-1][0] - mid[0][0]
    names = ("pending loads", "loader queue", "payloads waiting for room", "slots in use",
             "records sampled, not acknowledged", "decodes/s", "busy loader threads")
    out.write(f"# summary over {len(mid)} samples, {span:.1f} s (the middle three fifths)\n")
    for i, name in enumerate(names, start=1):
        v = sorted(x[i] for x in mid if x[i] == x[i])
        if v:
            out.write(f"#   {name}: mean {statistics.fmean(v):.1f}, p10 {v[len(v) // 10]:.1f}, "
                      f"p50 {v[len(v) // 2]:.1f}, p90 {v[len(v) * 9 // 10]:.1f}\n")
    if span > 0:
        stall = (mid[-1][8] - mid[0][8]) / span
        acked = (mid[-1][9] - mid[0][9]) / span
        out.write(f"#   clients waiting on an empty ring: {stall:.2f} of the time (summed over jobs); "
                  f"acknowledged {acked:.0f}/s\n")
    total = samples[-1][0] - (samples[0][0])
    if total > 0:
        out.write("#   server CPU cores by thread name (while jobs ran): " + ", ".join(
            f"{k} {(cpu1.get(k, 0) - cpu0.get(k, 0)) / total:.2f}" for k in sorted(cpu1)
            if cpu1.get(k, 0) - cpu0.get(k, 0) > 0.01 * total) + "\n")
        for p in jcpu1:
            a, b = jcpu0.get(p, {}), jcpu1[p]
            out.write(f"#   job {p} CPU cores by thread name: " + ", ".join(
                f"{k} {(b[k] - a.get(k, 0)) / total:.2f}" for k in sorted(b)
                if b[k] - a.get(k, 0) > 0.01 * total) + "\n")


if __name__ == "__main__":
    main()
