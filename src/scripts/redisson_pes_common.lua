-- Shared by the RPermitExpirableSemaphore scripts (redisson_pes_*.lua), prepended to
-- each. The layout is Redisson's (RedissonPermitExpirableSemaphore.java):
-- KEYS: 1 NAME (the counter of free permits), 2 {NAME}:timeout (zset: permit id as 16
--       raw bytes -> lease deadline in client epoch ms, or NO_LEASE), 3 the channel
--       redisson_sc:{NAME}
-- ARGV: 1 publish command (PUBLISH or SPUBLISH), 2 now (client epoch ms), then the
--       script's own arguments.
-- No TIME call: deadlines and "now" are the clients' clocks, as in Redisson.

local PUB, NOW = ARGV[1], ARGV[2]
local NO_LEASE = '922337203685477'

-- Redisson's reclaim: the members of the lease zset scored in [0, now] (expired) are
-- removed, the counter goes up by their number, and the new counter is published
-- when it is positive. `limit`: at most that many (the acquire's LIMIT 0 n); nil: all.
local function reclaim(limit)
    local n
    if limit then
        local ids = redis.call('ZRANGEBYSCORE', KEYS[2], 0, NOW, 'LIMIT', 0, limit)
        for _, id in ipairs(ids) do
            redis.call('ZREM', KEYS[2], id)
        end
        n = #ids
    else
        n = redis.call('ZREMRANGEBYSCORE', KEYS[2], 0, NOW)
    end
    if n > 0 then
        local value = redis.call('INCRBY', KEYS[1], n)
        if value > 0 then
            redis.call(PUB, KEYS[3], value)
        end
    end
end
