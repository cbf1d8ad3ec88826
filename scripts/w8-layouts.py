#!/usr/bin/env python3
"""Redis memory per held permit of one semaphore with 10,000 holders (W8), for today's
key layout and the layouts issue #12 names, measured as used_memory deltas on a
redis-server you start (it is FLUSHALLed).

Usage: scripts/w8-layouts.py PORT     e.g. redis-server --port 7393 --save '' &

Records are shaped like the scripts' (src/scripts/common.lua): a permit id of 36
characters, tokens of 16 digits, server times in milliseconds, a 14-character host.
Only memory is modelled: no script runs. Past 128 holders the zset is a skiplist and
the hash a hashtable, as in the bench's W8.
"""
import sys
import time
import uuid

from resp import Conn

PORT = int(sys.argv[1])
N = 10000
conn = Conn(PORT)
send, read, used = conn.send, conn.read, conn.used


now = int(time.time() * 1000) + 3600000
token = now * 1000
ORIGIN = "12345|worker-host-01|"  # pid|host|label, as each record carries it today


def today(i, pid):
    return [("ZADD", "h", now + i, pid),
            ("HSET", "i", pid, "1|%d|%d|%d|%s" % (token + i, i, now, ORIGIN))]


def origin_per_client(i, pid):
    # the record names its client's origin entry (written once per client) by a short ref
    return [("ZADD", "h", now + i, pid),
            ("HSET", "i", pid, "1|%d|%d|%d|c7" % (token + i, i, now))]


def binary_ids_origin_per_client(i, pid):
    b = uuid.UUID(pid).bytes
    return [("ZADD", "h", now + i, b),
            ("HSET", "i", b, "1|%d|%d|%d|c7" % (token + i, i, now))]


def slot_keyed(i, pid):
    # a sorted index kept by slot: the zset's member is the holder's first slot (the
    # client knows it and would pass it with the id), the record under the slot holds
    # the id for the check
    return [("ZADD", "h", now + i, i),
            ("HSET", "i", "#%d" % i, "%s|1|%d|%d|%s" % (pid, token + i, now, ORIGIN))]


def one_key(i, pid):
    return [("HSET", "i", pid, "1|%d|%d|%d|%d|%s" % (token + i, i, now, now + i, ORIGIN))]


def one_key_origin_per_client(i, pid):
    return [("HSET", "i", pid, "1|%d|%d|%d|%d|c7" % (token + i, i, now, now + i))]


for name, make in [
    ("today: holders zset + record in the state hash, origin per permit", today),
    ("today's keys, origin once per client", origin_per_client),
    ("today's keys, 16-byte binary ids, origin once per client", binary_ids_origin_per_client),
    ("today's two structures, both keyed by the holder's slot", slot_keyed),
    ("one hash: record with its deadline, origin per permit", one_key),
    ("one hash: record with its deadline, origin once per client", one_key_origin_per_client),
]:
    send("FLUSHALL")
    read()
    before, sent = used(), 0
    for i in range(N):
        for cmd in make(i, str(uuid.uuid4())):
            send(*cmd)
            sent += 1
    for _ in range(sent):
        read()
    print("%-70s %6.1f bytes per holder" % (name, (used() - before) / N))
