-- Shared by the RPermitExpirableSemaphore scripts (redisson_pes_*.lua), prepended to
-- each. The layout is Redisson's (RedissonPermitExpirableSemaphore.java):
-- KEYS: 1 NAME (the counter of free permits), 2 {NAME}:timeout (zset: permit id as 16
--       raw bytes -> lease deadline in client epoch ms, or NO_LEASE), 3 the channel
--       redisson_sc:{NAME}
-- ARGV: 1 publish command (redisson_publish.lua), 2 now (client epoch ms), then the
--       script's own arguments.
-- No TIME call: deadlines and "now" are the clients' clocks, as in Redisson.
--
-- Failure points. Redis does not undo a script's writes, so each script fails before
-- its first write or runs to its end:
--   - the lease zset of another type: its first read (ZRANGEBYSCORE, ZCOUNT, ZSCORE)
--     fails, and every script reads it before it writes;
--   - the counter of another type, or not an integer (it may be absent, as in
--     Redisson): where a script changes it after other writes, the INCRBY is moved
--     first (incr(), through redis.pcall: the same keys and reply as Redisson's order,
--     as nothing else runs between), and a refused one returns an error reply with
--     nothing written (WRONGTYPE naming the key and the value for text that is no
--     integer, else the INCRBY's own: READONLY, OOM...); elsewhere counter_value()
--     or its GET fails before any write (redisson_counter.lua);
--   - an argument Redis refuses (NOW in reclaim's first read; a deadline, which the
--     bodies check first): before any write. The Rust side sends only integers;
--   - out of memory: Redis refuses only a script's first write;
--   - PUBLISH/SPUBLISH refused (ACL, SPUBLISH before Redis 7): sent with
--     redis.pcall, its error ignored (redisson_publish.lua; a waiter also polls, see
--     src/compat/redisson.rs).

local NOW = ARGV[2]
local NO_LEASE = '922337203685477'

-- (incr(n), the INCRBY that comes first in a script that changes the counter after
-- other writes, is in redisson_counter.lua, which comes before this part)

-- Redisson's reclaim: the members of the lease zset scored in [0, now] (expired) are
-- removed, the counter goes up by their number, and the new counter is published
-- when it is positive. `limit`: at most that many (the acquire's LIMIT 0 n); nil: all.
-- The expired members are counted by a read, so the INCRBY is the first write.
-- Returns nil, or an error reply (nothing written) the caller returns.
local function reclaim(limit)
    local ids, n
    if limit then
        ids = redis.call('ZRANGEBYSCORE', KEYS[2], 0, NOW, 'LIMIT', 0, limit)
        n = #ids
    else
        n = redis.call('ZCOUNT', KEYS[2], 0, NOW)
    end
    if n == 0 then return nil end
    local value, bad = incr(n)
    if bad then return bad end
    if ids then
        for _, id in ipairs(ids) do
            redis.call('ZREM', KEYS[2], id)
        end
    else
        redis.call('ZREMRANGEBYSCORE', KEYS[2], 0, NOW)
    end
    if value > 0 then
        publish(KEYS[3], value)
    end
    return nil
end
