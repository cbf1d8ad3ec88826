#!/usr/bin/env python3
"""A Redisson peer for the interop tests of redis-semaphore's `compat::redisson`
(tests/redisson_compat.rs): it plays a Java service on Redisson's `RSemaphore` and
`RPermitExpirableSemaphore`, on the same keys as the Rust client.

Written from the protocol description (shared/reference/redisson-protocol.md), not
from Redisson's code: the keys (`NAME`, `{NAME}:timeout`, `redisson_sc:{NAME}`), the
KEYS/ARGV orders Redisson sends, each script's steps, permit ids as 16 random bytes
(hex in the API, raw bytes in the zset), client-clock deadlines in epoch ms, and the
waiting loop (try once; subscribe; then try, wait for a message or the nearest lease
deadline, try again). A message is a decimal count: a waiter wakes for a positive one.

Usage:
  redisson_peer.py --url URL --name NAME repl
      Prints READY, then answers one line per command read on stdin:
        try-set P                 -> OK True|False
        rs-try N                  -> OK True|False
        rs-acquire N WAIT_MS      -> [WAITING] then GOT | TIMEOUT
        rs-release N              -> OK <counter after>
        rs-available              -> OK <counter>
        pes-try N LEASE_MS        -> GOT <hex> ... | NONE      (LEASE_MS -1: no lease)
        pes-try-legacy N LEASE_MS -> GOT <hex> ... | NONE      (pre-3.17: hex members)
        pes-acquire N LEASE_MS WAIT_MS -> [WAITING] then GOT <hex> ... | TIMEOUT
        pes-release HEX           -> OK True|False             (tryRelease)
        pes-available             -> OK <n>
        pes-acquired              -> OK <n>
        quit                      -> exits
      WAITING is printed once a blocked acquire is subscribed and its try after the
      subscription failed: from then on only a message (or a deadline) wakes it.
  redisson_peer.py --url URL --name NAME contend rs|pes INSIDE_KEY
      Prints READY, waits for a line (the start signal), then acquires one permit,
      INCRs INSIDE_KEY, DECRs it and releases, in a loop, until a line "stop" arrives;
      prints RESULT grants=G most=M (M: the highest INSIDE_KEY value it saw).
"""

import argparse
import os
import sys
import time

import redis
from peer_harness import contend, say

NO_LEASE = 922337203685477
PUBLISH = "PUBLISH"

# --- RSemaphore (RedissonSemaphore.java) ----------------------------------------------
# KEYS = [NAME]; ARGV = [n]
RS_TRY_ACQUIRE = """
local value = redis.call('get', KEYS[1])
if value ~= false and tonumber(value) >= tonumber(ARGV[1]) then
    redis.call('decrby', KEYS[1], ARGV[1])
    return 1
end
return 0
"""
# KEYS = [NAME, channel]; ARGV = [n, publish-cmd]
RS_RELEASE = """
local value = redis.call('incrby', KEYS[1], ARGV[1])
redis.call(ARGV[2], KEYS[2], value)
return value
"""
# KEYS = [NAME, channel]; ARGV = [p, publish-cmd]
TRY_SET = """
if redis.call('exists', KEYS[1]) == 1 then
    return 0
end
redis.call('set', KEYS[1], ARGV[1])
redis.call(ARGV[2], KEYS[2], ARGV[1])
return 1
"""

# --- RPermitExpirableSemaphore (RedissonPermitExpirableSemaphore.java) -----------------
# KEYS = [NAME, NAME-timeout, channel]
# ARGV = [n, timeoutDate, now, NO_LEASE, publish-cmd, id1 .. idn]
PES_TRY_ACQUIRE = """
local expired = redis.call('zrangebyscore', KEYS[2], 0, ARGV[3], 'limit', 0, ARGV[1])
if #expired > 0 then
    redis.call('zrem', KEYS[2], unpack(expired))
    local value = redis.call('incrby', KEYS[1], #expired)
    if tonumber(value) > 0 then
        redis.call(ARGV[5], KEYS[3], value)
    end
end
local value = redis.call('get', KEYS[1])
if value ~= false and tonumber(value) >= tonumber(ARGV[1]) then
    redis.call('decrby', KEYS[1], ARGV[1])
    for i = 6, #ARGV do
        redis.call('zadd', KEYS[2], ARGV[2], ARGV[i])
    end
    local ttl = redis.call('pttl', KEYS[1])
    if ttl > 0 then
        redis.call('pexpire', KEYS[2], ttl)
    end
    return 'OK'
end
local v = redis.call('zrange', KEYS[2], 0, 0, 'withscores')
if v[1] ~= nil and tonumber(v[2]) ~= tonumber(ARGV[4]) then
    return ':' .. v[2]
end
return nil
"""
# KEYS = [NAME, channel, NAME-timeout]; ARGV = [id, 1, now, publish-cmd]
PES_TRY_RELEASE = """
local expire = redis.call('zscore', KEYS[3], ARGV[1])
local removed = redis.call('zrem', KEYS[3], ARGV[1])
if tonumber(removed) ~= 1 then
    return 0
end
local value = redis.call('incrby', KEYS[1], ARGV[2])
redis.call(ARGV[4], KEYS[2], value)
if tonumber(expire) <= tonumber(ARGV[3]) then
    return 0
end
return 1
"""
# KEYS = [NAME, NAME-timeout, channel]; ARGV = [now, publish-cmd, what]
PES_READ = """
local expired = redis.call('zrangebyscore', KEYS[2], 0, ARGV[1])
if #expired > 0 then
    for _, id in ipairs(expired) do
        redis.call('zrem', KEYS[2], id)
    end
    local value = redis.call('incrby', KEYS[1], #expired)
    if tonumber(value) > 0 then
        redis.call(ARGV[2], KEYS[3], value)
    end
end
if ARGV[3] == 'acquired' then
    return redis.call('zcount', KEYS[2], 0, '+inf')
end
local value = redis.call('get', KEYS[1])
if value == false then
    return 0
end
return tonumber(value)
"""


def now_ms():
    return int(time.time() * 1000)


class Peer:
    def __init__(self, url, name):
        self.conn = redis.Redis.from_url(url)
        self.name = name
        tagged = "{" in name
        self.timeout = name + ":timeout" if tagged else "{" + name + "}:timeout"
        self.channel = "redisson_sc:" + name if tagged else "redisson_sc:{" + name + "}"
        self.rs_try_acquire = self.conn.register_script(RS_TRY_ACQUIRE)
        self.rs_release_script = self.conn.register_script(RS_RELEASE)
        self.try_set_script = self.conn.register_script(TRY_SET)
        self.pes_try_acquire_script = self.conn.register_script(PES_TRY_ACQUIRE)
        self.pes_try_release_script = self.conn.register_script(PES_TRY_RELEASE)
        self.pes_read_script = self.conn.register_script(PES_READ)

    # RSemaphore
    def try_set(self, p):
        return self.try_set_script(keys=[self.name, self.channel], args=[p, PUBLISH]) == 1

    def rs_try(self, n):
        return self.rs_try_acquire(keys=[self.name], args=[n]) == 1

    def rs_release(self, n):
        return self.rs_release_script(keys=[self.name, self.channel], args=[n, PUBLISH])

    def rs_available(self):
        v = self.conn.get(self.name)
        return 0 if v is None else int(v)

    # RPermitExpirableSemaphore
    def pes_try(self, n, lease_ms, legacy=False):
        """None, (':', deadline ms) or the hex ids."""
        ids = [os.urandom(16) for _ in range(n)]
        members = [i.hex().encode() for i in ids] if legacy else ids
        now = now_ms()
        deadline = NO_LEASE if lease_ms < 0 else now + lease_ms
        r = self.pes_try_acquire_script(
            keys=[self.name, self.timeout, self.channel],
            args=[n, deadline, now, NO_LEASE, PUBLISH] + members,
        )
        if r is None:
            return None
        r = r.decode() if isinstance(r, bytes) else r
        if r == "OK" or r is True:
            return [i.hex() for i in ids]
        if r.startswith(":"):
            return (":", int(float(r[1:])))
        raise RuntimeError("unexpected acquire reply %r" % (r,))

    def pes_release(self, hex_id):
        r = self.pes_try_release_script(
            keys=[self.name, self.channel, self.timeout],
            args=[bytes.fromhex(hex_id), 1, now_ms(), PUBLISH],
        )
        return r == 1

    def pes_read(self, what):
        return self.pes_read_script(
            keys=[self.name, self.timeout, self.channel], args=[now_ms(), PUBLISH, what]
        )

    def wait(self, attempt, wait_ms):
        """Redisson's loop: try; subscribe; then try, wait, try... Returns the
        attempt's result, or None at the deadline."""
        end = time.monotonic() + wait_ms / 1000.0
        r = attempt()
        if r is not None and not isinstance(r, tuple):
            return r
        ps = self.conn.pubsub()
        ps.subscribe(self.channel)
        # wait for the subscription's confirmation before the next try
        while True:
            m = ps.get_message(timeout=1.0)
            if m is not None and m["type"] == "subscribe":
                break
        announced = False
        try:
            while True:
                r = attempt()
                if r is not None and not isinstance(r, tuple):
                    return r
                if not announced:
                    say("WAITING")
                    announced = True
                left = end - time.monotonic()
                if left <= 0:
                    return None
                if isinstance(r, tuple):
                    left = min(left, max(0.001, (r[1] - now_ms()) / 1000.0))
                until = time.monotonic() + left
                while True:
                    t = until - time.monotonic()
                    if t <= 0:
                        break
                    m = ps.get_message(timeout=t)
                    if m is not None and m["type"] == "message":
                        if int(m["data"]) > 0:
                            break
        finally:
            ps.close()


def repl(peer):
    say("READY")
    for line in sys.stdin:
        f = line.split()
        if not f:
            continue
        cmd, args = f[0], f[1:]
        if cmd == "quit":
            return
        if cmd == "try-set":
            say("OK %s" % peer.try_set(int(args[0])))
        elif cmd == "rs-try":
            say("OK %s" % peer.rs_try(int(args[0])))
        elif cmd == "rs-acquire":
            n = int(args[0])
            got = peer.wait(lambda: True if peer.rs_try(n) else None, int(args[1]))
            say("GOT" if got else "TIMEOUT")
        elif cmd == "rs-release":
            say("OK %d" % peer.rs_release(int(args[0])))
        elif cmd == "rs-available":
            say("OK %d" % peer.rs_available())
        elif cmd in ("pes-try", "pes-try-legacy"):
            r = peer.pes_try(int(args[0]), int(args[1]), legacy=cmd == "pes-try-legacy")
            say("GOT " + " ".join(r) if isinstance(r, list) else "NONE")
        elif cmd == "pes-acquire":
            n, lease = int(args[0]), int(args[1])
            r = peer.wait(lambda: peer.pes_try(n, lease), int(args[2]))
            say("GOT " + " ".join(r) if r else "TIMEOUT")
        elif cmd == "pes-release":
            say("OK %s" % peer.pes_release(args[0]))
        elif cmd == "pes-available":
            say("OK %d" % peer.pes_read("available"))
        elif cmd == "pes-acquired":
            say("OK %d" % peer.pes_read("acquired"))
        else:
            say("ERR unknown command %s" % cmd)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--url", required=True)
    ap.add_argument("--name", required=True)
    ap.add_argument("mode", choices=["repl", "contend"])
    ap.add_argument("rest", nargs="*")
    a = ap.parse_args()
    peer = Peer(a.url, a.name)
    if a.mode == "repl":
        repl(peer)
    else:
        kind, inside = a.rest[0], a.rest[1]

        def once():
            if kind == "rs":
                return (lambda: peer.rs_release(1)) if peer.rs_try(1) else None
            r = peer.pes_try(1, 10000)
            return (lambda: peer.pes_release(r[0])) if isinstance(r, list) else None

        contend(peer.conn, inside, once)


if __name__ == "__main__":
    main()
