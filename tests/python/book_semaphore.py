#!/usr/bin/env python3
"""The counting semaphores of "Redis in Action" (ch. 6.3, listings 12-17), for the
interop tests of redis-semaphore's `compat::book` (tests/book_compat.rs).

The functions below follow the published listings line by line. The only changes:

- redis-py >= 3 call shapes (`zadd(name, {member: score})`, `decode_responses=True`
  so `release_lock` can compare the lock value with a str);
- `now()` instead of `time.time()`, so a test can shift this client's clock
  (`--clock-offset`) and choose the score unit (`--unit s` like the book, `ms` like
  the Java and Node ports);
- `pause()`, a no-op unless a test asks for it (`acquire-paused`): it stops an acquire
  between its round trips, where the book says the race lies;
- `acquire_lock` is the book's `acquire_lock_with_timeout`, whose expiry listing 17
  needs for a holder that dies; `not conn.ttl(...)` is written `conn.ttl(...) == -1`,
  its meaning with redis-py >= 3 (TTL returns -1, not None, for a key without expiry).

Usage:
  book_semaphore.py --url URL --variant basic|fair|lock --unit s|ms --name NAME
                    --limit N [--timeout SECONDS] [--clock-offset SECONDS] repl
      Prints READY, then answers one line per command read on stdin:
        acquire       -> GOT <id> | NONE
        acquire-paused -> PAUSED, then after a line "resume": GOT <id> | NONE
                         (an acquire stopped where the book's race lies: basic after
                         reading the clock, fair after INCR, with the lock held)
        release <id>  -> RELEASED True|False
        refresh <id>  -> REFRESHED True|False
        quit          -> exits
  ... contend --inside KEY
      Prints READY, waits for a line on stdin (the start signal), then acquires and
      releases in a loop until stdin is closed or says stop. Around each hold it
      INCRs and DECRs KEY, and prints RESULT grants=G most=M at the end, M being the
      highest value of KEY it saw.
"""

import argparse
import math
import sys
import time
import uuid

import redis
from peer_harness import contend, say

CLOCK_OFFSET = 0.0
UNIT = "s"
PAUSE = False


def pause():
    """Test hook: stops here until the test says resume (see acquire-paused)."""
    if PAUSE:
        say("PAUSED")
        sys.stdin.readline()


def now():
    t = time.time() + CLOCK_OFFSET
    return t if UNIT == "s" else int(t * 1000)


def span(timeout):
    """A timeout in seconds, in the score unit."""
    return timeout if UNIT == "s" else int(timeout * 1000)


# Listing 12
def acquire_semaphore(conn, semname, limit, timeout=10):
    identifier = str(uuid.uuid4())
    t = now()
    pause()

    pipeline = conn.pipeline(True)
    pipeline.zremrangebyscore(semname, "-inf", t - span(timeout))
    pipeline.zadd(semname, {identifier: t})
    pipeline.zrank(semname, identifier)
    if pipeline.execute()[-1] < limit:
        return identifier

    conn.zrem(semname, identifier)
    return None


# Listing 13
def release_semaphore(conn, semname, identifier):
    return conn.zrem(semname, identifier)


# Listing 14
def acquire_fair_semaphore(conn, semname, limit, timeout=10):
    identifier = str(uuid.uuid4())
    czset = semname + ":owner"
    ctr = semname + ":counter"

    t = now()
    pipeline = conn.pipeline(True)
    pipeline.zremrangebyscore(semname, "-inf", t - span(timeout))
    pipeline.zinterstore(czset, {czset: 1, semname: 0})

    pipeline.incr(ctr)
    counter = pipeline.execute()[-1]
    pause()

    pipeline.zadd(semname, {identifier: t})
    pipeline.zadd(czset, {identifier: counter})

    pipeline.zrank(czset, identifier)
    if pipeline.execute()[-1] < limit:
        return identifier

    pipeline.zrem(semname, identifier)
    pipeline.zrem(czset, identifier)
    pipeline.execute()
    return None


# Listing 15
def release_fair_semaphore(conn, semname, identifier):
    pipeline = conn.pipeline(True)
    pipeline.zrem(semname, identifier)
    pipeline.zrem(semname + ":owner", identifier)
    return pipeline.execute()[0]


# Listing 16
def refresh_fair_semaphore(conn, semname, identifier):
    if conn.zadd(semname, {identifier: now()}):
        release_fair_semaphore(conn, semname, identifier)
        return False
    return True


# Listing 6.11 (acquire_lock_with_timeout)
def acquire_lock(conn, lockname, acquire_timeout=10, lock_timeout=10):
    identifier = str(uuid.uuid4())
    lockname = "lock:" + lockname
    lock_timeout = int(math.ceil(lock_timeout))

    end = time.time() + acquire_timeout
    while time.time() < end:
        if conn.setnx(lockname, identifier):
            conn.expire(lockname, lock_timeout)
            return identifier
        elif conn.ttl(lockname) == -1:
            conn.expire(lockname, lock_timeout)

        time.sleep(0.001)

    return False


# Listing 6.9 (release_lock)
def release_lock(conn, lockname, identifier):
    pipe = conn.pipeline(True)
    lockname = "lock:" + lockname

    while True:
        try:
            pipe.watch(lockname)
            if pipe.get(lockname) == identifier:
                pipe.multi()
                pipe.delete(lockname)
                pipe.execute()
                return True

            pipe.unwatch()
            break

        except redis.exceptions.WatchError:
            pass

    return False


# Listing 17
def acquire_semaphore_with_lock(conn, semname, limit, timeout=10):
    identifier = acquire_lock(conn, semname, acquire_timeout=0.01)
    if identifier:
        try:
            return acquire_fair_semaphore(conn, semname, limit, timeout)
        finally:
            release_lock(conn, semname, identifier)


VARIANTS = {
    "basic": (acquire_semaphore, release_semaphore, None),
    "fair": (acquire_fair_semaphore, release_fair_semaphore, refresh_fair_semaphore),
    "lock": (acquire_semaphore_with_lock, release_fair_semaphore, refresh_fair_semaphore),
}


def repl(conn, args, acquire, release, refresh):
    global PAUSE
    say("READY")
    while True:
        line = sys.stdin.readline()
        if not line:
            return
        words = line.split()
        if not words:
            continue
        if words[0] == "acquire":
            ident = acquire(conn, args.name, args.limit, args.timeout)
            say("GOT", ident) if ident else say("NONE")
        elif words[0] == "acquire-paused":
            PAUSE = True
            try:
                ident = acquire(conn, args.name, args.limit, args.timeout)
            finally:
                PAUSE = False
            say("GOT", ident) if ident else say("NONE")
        elif words[0] == "release":
            say("RELEASED", bool(release(conn, args.name, words[1])))
        elif words[0] == "refresh":
            say("REFRESHED", bool(refresh(conn, args.name, words[1])))
        elif words[0] == "quit":
            return
        else:
            say("ERROR unknown command", words[0])


def main():
    global CLOCK_OFFSET, UNIT
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--url", required=True)
    p.add_argument("--variant", choices=sorted(VARIANTS), required=True)
    p.add_argument("--unit", choices=["s", "ms"], default="s")
    p.add_argument("--name", required=True)
    p.add_argument("--limit", type=int, required=True)
    p.add_argument("--timeout", type=float, default=10, help="seconds")
    p.add_argument("--clock-offset", type=float, default=0, help="seconds")
    sub = p.add_subparsers(dest="command", required=True)
    sub.add_parser("repl")
    c = sub.add_parser("contend")
    c.add_argument("--inside", required=True)
    args = p.parse_args()

    CLOCK_OFFSET = args.clock_offset
    UNIT = args.unit
    conn = redis.Redis.from_url(args.url, decode_responses=True)
    acquire, release, refresh = VARIANTS[args.variant]
    if args.command == "repl":
        repl(conn, args, acquire, release, refresh)
    else:

        def once():
            ident = acquire(conn, args.name, args.limit, args.timeout)
            return (lambda: release(conn, args.name, ident)) if ident else None

        contend(conn, args.inside, once, hold=0.001, backoff=0.001)


if __name__ == "__main__":
    main()
