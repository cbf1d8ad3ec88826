#!/usr/bin/env python3
"""Hand-offs between two processes (W4's shape) with a worker of the peers' harness
protocol (examples/peer_worker), counting each thread's voluntary context switches
(its sleeps, so its wake-ups) per hand-off, and the hand-off latency from the release
call to the waiter's return.

Usage: scripts/handoff-wakeups.py WORKER [HAND_OFFS]
       e.g. scripts/handoff-wakeups.py target/release/examples/peer_worker 400

It starts its own redis-server (from PATH) on a free loopback port and stops it. The
two workers take turns: one holds the only permit, the other blocks in ACQUIRE, the
holder releases. Each waiter is given 10 ms to queue before the release (a
measurement, not a test: a waiter not yet queued would only make that hand-off slower).
The switch counts are read from /proc and do not depend on how busy the machine is;
the latencies do.
"""
import glob
import socket
import subprocess
import sys
import time

worker = sys.argv[1]
n = int(sys.argv[2]) if len(sys.argv) > 2 else 400
s = socket.socket()
s.bind(("127.0.0.1", 0))
port = s.getsockname()[1]
s.close()
server = subprocess.Popen(
    ["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"],
    stdout=subprocess.DEVNULL,
)


def start():
    args = [worker, "--host", "127.0.0.1", "--port", str(port), "--key", "handoff",
            "--limit", "1", "--mode", "interactive", "--loops", "1", "--skew-ms", "0",
            "--lease-ms", "10000", "--retry-ms", "10", "--warmup", "50",
            "--iterations", "0", "--hold-min-us", "0", "--hold-max-us", "0",
            "--lock-ttl-ms", "10000"]
    deadline = time.monotonic() + 10
    while True:
        p = subprocess.Popen(args, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, bufsize=1)
        if p.stdout.readline().strip() == "READY":
            return p
        p.wait()
        if time.monotonic() > deadline:
            sys.exit("the worker did not start")
        time.sleep(0.1)  # the server may still be starting


def send(p, line):
    p.stdin.write(line + "\n")
    p.stdin.flush()


def switches(p):
    out = {}
    for task in glob.glob(f"/proc/{p.pid}/task/*"):
        name = open(task + "/comm").read().strip()
        for line in open(task + "/status"):
            if line.startswith("voluntary_ctxt_switches"):
                out[name] = out.get(name, 0) + int(line.split()[1])
    return out


try:
    a, b = start(), start()
    send(a, "ACQUIRE")
    a.stdout.readline()
    a.stdout.readline()
    before = [switches(a), switches(b)]
    holder, waiter = a, b
    lat = []
    for _ in range(n):
        send(waiter, "ACQUIRE")
        waiter.stdout.readline()  # STARTED
        time.sleep(0.01)
        send(holder, "RELEASE")
        released = holder.stdout.readline().split()
        acquired = waiter.stdout.readline().split()
        assert acquired[0] == "ACQUIRED", acquired
        lat.append((int(acquired[1]) - int(released[1])) / 1e6)
        holder, waiter = waiter, holder
    after = [switches(a), switches(b)]
    total = {}
    for x, y in zip(before, after):
        for k in y:
            total[k] = total.get(k, 0) + y[k] - x.get(k, 0)
    print("voluntary switches per hand-off, both processes:",
          ", ".join(f"{k} {v / n:.2f}" for k, v in sorted(total.items())))
    lat.sort()
    print("hand-off from the release call, ms: p50 %.3f, p90 %.3f, p99 %.3f"
          % (lat[n // 2], lat[int(n * 0.9)], lat[int(n * 0.99)]))
    for p in (a, b):
        send(p, "QUIT")
finally:
    server.terminate()
