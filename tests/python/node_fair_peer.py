#!/usr/bin/env python3
"""The Node.js (ioredis) semaphores of seed 004, in Python, for the interop tests of
redis-semaphore's `BookVariant::NodeFair` and `Basic` + `TimeUnit::Millis`
(tests/node_compat.rs).

Written from the seed's steps (see ../shared/reference/node-port-semaphores.md), not from
any Node code. What the port does, kept here:

- ids are uuid v4 text; times are whole client milliseconds (`new Date().getTime()`);
- `limit` and `timeout` (ms) are per call, defaults 5 and 10000;
- each batch is a plain pipeline (`redis.pipeline()` in ioredis): NOT `MULTI`, so
  other clients' commands may run between its commands;
- basic (`NAME`): one pipeline ZREMRANGEBYSCORE NAME -inf now-timeout, ZADD NAME now id,
  ZRANK NAME id; rank < limit -> id, else ZREM NAME id (unawaited in Node) -> null;
- fair (`NAME:time`, `NAME:count`, the global `semaphore:count`): pipeline 1
  ZREMRANGEBYSCORE NAME:time -inf now-timeout, ZINTERSTORE NAME:count 2 NAME:count
  NAME:time WEIGHTS 1 0, INCR semaphore:count -> ticket; pipeline 2 ZADD NAME:time now
  id, ZADD NAME:count ticket id, ZRANK NAME:count id; rank < limit -> id, else ZREM from
  both (unawaited in Node) -> null;
- release (not in the post, by construction): ZREM from the zset(s).

Usage:
  node_fair_peer.py --url URL --variant basic|fair --name NAME [--limit N]
                    [--timeout MS] [--clock-offset MS] repl
      Prints READY, then answers one line per command read on stdin:
        acquire          -> GOT <id> <ticket> | NONE   (ticket: 0 for basic)
        acquire-paused   -> PAUSED (fair: stopped after pipeline 1, the INCR), then after
                            a line "resume": GOT <id> <ticket> | NONE
        release <id>     -> RELEASED True|False
        quit             -> exits
  ... contend --inside KEY
      Prints READY, waits for a line on stdin (the start signal), then acquires and
      releases in a loop until stdin is closed or says stop. Around each hold it INCRs
      and DECRs KEY, and prints RESULT grants=G most=M at the end, M being the highest
      value of KEY it saw.
"""

import argparse
import sys
import time
import uuid

import redis
from peer_harness import contend, say

GLOBAL_COUNTER = "semaphore:count"
CLOCK_OFFSET_MS = 0
PAUSE = False


def pause():
    """Test hook: stops here until the test says resume (see acquire-paused)."""
    if PAUSE:
        say("PAUSED")
        sys.stdin.readline()


def now_ms():
    """`new Date().getTime()`: whole milliseconds since the epoch, client clock."""
    return int(time.time() * 1000) + CLOCK_OFFSET_MS


def acquire_basic(conn, name, limit=5, timeout=10000):
    ident = str(uuid.uuid4())
    now = now_ms()
    pipeline = conn.pipeline(transaction=False)
    pipeline.zremrangebyscore(name, "-inf", now - timeout)
    pipeline.zadd(name, {ident: now})
    pipeline.zrank(name, ident)
    results = pipeline.execute()
    if results[-1] is not None and results[-1] < limit:
        return ident, 0
    conn.zrem(name, ident)
    return None


def release_basic(conn, name, ident):
    return conn.zrem(name, ident) == 1


def acquire_fair(conn, name, limit=5, timeout=10000):
    ident = str(uuid.uuid4())
    now = now_ms()
    time_key = name + ":time"
    count_key = name + ":count"

    pipeline = conn.pipeline(transaction=False)
    pipeline.zremrangebyscore(time_key, "-inf", now - timeout)
    # the seed's explicit form: ZINTERSTORE count 2 count time WEIGHTS 1 0
    pipeline.execute_command(
        "ZINTERSTORE", count_key, 2, count_key, time_key, "WEIGHTS", 1, 0
    )
    pipeline.incr(GLOBAL_COUNTER)
    ticket = pipeline.execute()[-1]
    pause()

    pipeline = conn.pipeline(transaction=False)
    pipeline.zadd(time_key, {ident: now})
    pipeline.zadd(count_key, {ident: ticket})
    pipeline.zrank(count_key, ident)
    rank = pipeline.execute()[-1]
    if rank is not None and rank < limit:
        return ident, ticket

    conn.zrem(time_key, ident)
    conn.zrem(count_key, ident)
    return None


def release_fair(conn, name, ident):
    pipeline = conn.pipeline(transaction=False)
    pipeline.zrem(name + ":time", ident)
    pipeline.zrem(name + ":count", ident)
    return pipeline.execute()[0] == 1


VARIANTS = {
    "basic": (acquire_basic, release_basic),
    "fair": (acquire_fair, release_fair),
}


def repl(conn, args, acquire, release):
    global PAUSE
    say("READY")
    while True:
        line = sys.stdin.readline()
        if not line:
            return
        words = line.split()
        if not words:
            continue
        if words[0] in ("acquire", "acquire-paused"):
            PAUSE = words[0] == "acquire-paused"
            try:
                got = acquire(conn, args.name, args.limit, args.timeout)
            finally:
                PAUSE = False
            if got:
                say("GOT", got[0], got[1])
            else:
                say("NONE")
        elif words[0] == "release":
            say("RELEASED", release(conn, args.name, words[1]))
        elif words[0] == "quit":
            return
        else:
            say("ERROR unknown command", words[0])


def main():
    global CLOCK_OFFSET_MS
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--url", required=True)
    p.add_argument("--variant", choices=sorted(VARIANTS), required=True)
    p.add_argument("--name", required=True)
    p.add_argument("--limit", type=int, default=5)
    p.add_argument("--timeout", type=int, default=10000, help="milliseconds")
    p.add_argument("--clock-offset", type=int, default=0, help="milliseconds")
    sub = p.add_subparsers(dest="command", required=True)
    sub.add_parser("repl")
    c = sub.add_parser("contend")
    c.add_argument("--inside", required=True)
    args = p.parse_args()

    CLOCK_OFFSET_MS = args.clock_offset
    conn = redis.Redis.from_url(args.url, decode_responses=True)
    acquire, release = VARIANTS[args.variant]
    if args.command == "repl":
        repl(conn, args, acquire, release)
    else:

        def once():
            got = acquire(conn, args.name, args.limit, args.timeout)
            return (lambda: release(conn, args.name, got[0])) if got else None

        contend(conn, args.inside, once, hold=0.001, backoff=0.001)


if __name__ == "__main__":
    main()
