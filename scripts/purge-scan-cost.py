#!/usr/bin/env python3
"""What finding expired holders costs without a sorted index of deadlines (issue #12,
the one-key layout's first prerequisite). Writes N holder records, each with its
deadline, into one hash (the one-key layout's shape) and times a script that reads
them all (HGETALL) and parses every deadline to find the expired ones and the earliest
(the purge a call must do once the earliest deadline may have passed). Prints the best
and the median of 7 runs, in ms, round trip included (about 0.07 ms here).

Usage: scripts/purge-scan-cost.py PORT     e.g. redis-server --port 7393 --save '' &
(needs the `redis` Python package: tests/python/requirements.txt)
"""
import sys
import time
import uuid

import redis

r = redis.Redis(port=int(sys.argv[1]))
now = int(time.time() * 1000) + 3600000
LUA = """local a = redis.call('HGETALL', KEYS[1]); local m = math.huge
for k = 2, #a, 2 do
  local d = tonumber(string.match(a[k], '^[^|]*|[^|]*|[^|]*|[^|]*|(%d+)'))
  if d < m then m = d end
end
return tostring(m)"""
sha = r.script_load(LUA)
for n in (5, 100, 1000, 10000):
    r.delete("purge-scan")
    p = r.pipeline(transaction=False)
    for i in range(n):
        p.hset("purge-scan", str(uuid.uuid4()),
               "1|%d|%d|%d|%d|12345|worker-host-01|" % (now * 1000 + i, i, now, now + i))
    p.execute()
    times = []
    for _ in range(7):
        t = time.perf_counter()
        r.evalsha(sha, 1, "purge-scan")
        times.append((time.perf_counter() - t) * 1e3)
    times.sort()
    print("%6d holders: a full scan for expired holders and the earliest deadline "
          "%.3f ms best, %.3f ms median" % (n, times[0], times[3]))
