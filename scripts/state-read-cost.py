#!/usr/bin/env python3
"""What holder records in the state hash cost the state read (issue #12: "holder
records apart from the state fields"). Times, inside one script, 100,000 HMGETs of the
nine state fields on a hash that also holds 0, 5, 20 or 100 holder records (listpack
encoded, as a semaphore's hash is below 128 entries), with 'limit' and 'lk' absent as
on a semaphore without a stored limit (an absent field is a full scan of a listpack).
Prints the best and the median of 5 runs per hash, in microseconds per HMGET.

Usage: scripts/state-read-cost.py PORT     e.g. redis-server --port 7393 --save '' &
(needs the `redis` Python package: tests/python/requirements.txt)
"""
import sys
import time
import uuid

import redis

r = redis.Redis(port=int(sys.argv[1]))
FIELDS = ["used", "ctr", "limit", "lk", "exp", "mind", "qn", "qseq", "cl"]
LUA = ("for i=1,tonumber(ARGV[1]) do redis.call('HMGET', KEYS[1], "
       + ", ".join("'%s'" % f for f in FIELDS) + ") end return 1")
N = 100000


def make(key, holders):
    r.delete(key)
    m = {f: "1700000000000" for f in FIELDS if f not in ("limit", "lk")}
    for i in range(holders):
        m[str(uuid.uuid4())] = "1|1700000000000123|%d|1700000000000|12345|worker-host-01|" % i
    r.hset(key, mapping=m)
    return r.object("encoding", key).decode()


sha = r.script_load(LUA)
runs = {h: (make("state-read:%d" % h, h), []) for h in (0, 5, 20, 100)}
for _ in range(5):
    for h, (_, times) in runs.items():
        t = time.perf_counter()
        r.evalsha(sha, 1, "state-read:%d" % h, N)
        times.append((time.perf_counter() - t) / N * 1e6)
for h, (enc, times) in runs.items():
    times.sort()
    print("%4d holder records in the hash (%s): HMGET of 9 state fields %.2f us best, %.2f median"
          % (h, enc, times[0], times[2]))
