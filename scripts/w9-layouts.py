#!/usr/bin/env python3
"""Redis memory per semaphore with one holder (W9), for today's key layout and for
layouts with one key per semaphore, measured as used_memory deltas over 10,000
semaphores on a redis-server you start (it is FLUSHALLed).

Usage: scripts/w9-layouts.py PORT     e.g. redis-server --port 7393 --save '' &

The records are shaped like the scripts' (see src/scripts/common.lua): a permit id of 36
characters, tokens of 16 digits, server times in milliseconds. Only memory is modelled:
no script runs.
"""
import sys
import time
import uuid

from resp import Conn

PORT = int(sys.argv[1])
N = 10000
conn = Conn(PORT)
send, read, used = conn.send, conn.read, conn.used


now = int(time.time() * 1000) + 3600000  # an hour ahead: no key expires during the run
exp = now + 20000
token = now * 1000 + 123


def current(i):
    tag, pid = "{acct:%d}" % i, str(uuid.uuid4())
    return [
        ("ZADD", "redsem:%s:h" % tag, 9000000000000000, "~", now + 10000, pid),
        ("SET", "redsem:%s:s" % tag, b"\x80", "PXAT", exp),
        ("HSET", "redsem:%s:i" % tag, "used", 1, "ctr", token, "mind", now + 10000, "exp", exp,
         "qn", 0, "qseq", 0, "cl", 5, pid, "1|%d|0|%d|12345|myhost" % (token, now)),
        ("PEXPIREAT", "redsem:%s:h" % tag, exp),
        ("PEXPIREAT", "redsem:%s:i" % tag, exp),
    ]


def one_key(i):
    tag, pid = "{acct:%d}" % i, str(uuid.uuid4())
    return [
        ("HSET", "redsem:%s" % tag, "used", 1, "ctr", token, "mind", now + 10000, "exp", exp,
         "qn", 0, "qseq", 0, "cl", 5, "s", b"\x80",
         pid, "%d|1|%d|0|%d|12345|myhost" % (now + 10000, token, now)),
        ("PEXPIREAT", "redsem:%s" % tag, exp),
    ]


def one_key_one_state_field(i):
    tag, pid = "{acct:%d}" % i, str(uuid.uuid4())
    return [
        ("HSET", "redsem:%s" % tag, "st", b"1|%d|%d|%d|0|0|5|\x80" % (token, now + 10000, exp),
         pid, "%d|1|%d|0|%d|c1" % (now + 10000, token, now)),
        ("PEXPIREAT", "redsem:%s" % tag, exp),
    ]


def npm(i):
    return [("ZADD", "semaphore:acct:%d" % i, now, str(uuid.uuid4())),
            ("PEXPIRE", "semaphore:acct:%d" % i, 20000)]


for name, make in [
    ("today: three keys (holders zset, state hash, slot bitmap)", current),
    ("one hash per semaphore, today's fields, the bitmap a field", one_key),
    ("one hash per semaphore, the state in one field, origin per client", one_key_one_state_field),
    ("npm redis-semaphore: one zset", npm),
]:
    send("FLUSHALL")
    read()
    before, sent = used(), 0
    for i in range(N):
        for cmd in make(i):
            send(*cmd)
            sent += 1
    for _ in range(sent):
        read()
    print("%-70s %6.1f bytes per semaphore" % (name, (used() - before) / N))
