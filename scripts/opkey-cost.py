#!/usr/bin/env python3
"""What the counting semaphore's operation key costs the server (`once.lua`): N
try-acquire + release pairs of one permit, sent as the client sends them, with the
operation key (KEYS[5] and '@deadline', every call since the ninth session) or
without it (one server before), on a redis-server you start (it is FLUSHALLed).
Prints, per mode, the server's time per call (INFO commandstats, EVALSHA) and the
memory per call that is still held at the end (the keys live 15 s).

Usage: scripts/opkey-cost.py PORT [N=2000] [keyed|plain|both]
  e.g. redis-server --port 7393 --save '' &
For instructions instead of times, start the server under callgrind, run one mode,
and shut the server down (callgrind writes its totals at exit):
  valgrind --tool=callgrind --callgrind-out-file=/tmp/cg.MODE redis-server --port 7393 --save '' &
  scripts/opkey-cost.py 7393 2000 keyed; redis-cli -p 7393 shutdown nosave
  grep ^totals /tmp/cg.MODE
(needs the `redis` Python package: tests/python/requirements.txt)
"""
import sys
import time
import uuid
from pathlib import Path

import redis

PORT = int(sys.argv[1])
N = int(sys.argv[2]) if len(sys.argv) > 2 else 2000
MODES = {"keyed": [True], "plain": [False]}.get(sys.argv[3] if len(sys.argv) > 3 else "both",
                                                 [False, True, False, True])
S = Path(__file__).resolve().parent.parent / "src" / "scripts"
r = redis.Redis(port=PORT)


def script(body):
    return r.register_script("".join((S / f).read_text()
                                     for f in ("once.lua", "counting_common.lua", body)))


acquire, release = script("counting_acquire.lua"), script("counting_release.lua")
KEYS = ["redsem:{c}:count", "redsem:{c}:cq", "redsem:{c}:ch", "redsem:{c}:cw"]


def evalsha():
    line = r.info("commandstats")["cmdstat_evalsha"]
    return line["calls"], line["usec"]


for keyed in MODES:
    r.flushall()
    r.set(KEYS[0], 1)
    r.config_resetstat()
    used = r.info("memory")["used_memory"]
    for _ in range(N):
        deadline = "@%d" % (int(time.time() * 1000) + 14000)
        op = lambda: ["redsem:{c}:op:%s" % uuid.uuid4()] if keyed else []
        got = acquire(keys=KEYS + op(), args=[1, "t", "", "", 2000, 1000] + ([deadline] if keyed else []))
        assert got[0] == 1, got
        release(keys=KEYS + op(), args=[1] + ([deadline] if keyed else []))
    calls, usec = evalsha()
    grown = r.info("memory")["used_memory"] - used
    print("%-5s %d calls: %.2f us per call, %d bytes per call held" %
          ("keyed" if keyed else "plain", calls, usec / calls, grown / (2 * N)))
