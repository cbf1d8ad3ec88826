-- counting acquire (P): take ARGV[1] permits if the count has them, else (mode 'w')
-- queue the caller to be told when to look again.
--
-- ARGV: 1 n (>= 1), 2 mode ('t' try: never queued; 'w' wait: queued when not
--       granted, its heartbeat renewed), 3 waiter id, 4 the waiter's wake-up channel,
--       5 heartbeat ms, 6 key padding ms
-- Reply: {1, count after}   granted: the count was >= n and went down by n
--        {0, count}         not now (count < n; an unset semaphore reads 0)
--
-- Keeps: C2 (DECRBY only when count >= n, so never below 0 and never while <= 0);
-- C3 (a granted waiter leaves the queue; a waiting one is in all three waiter keys,
-- with its first arrival kept, so it does not lose its place by looking again);
-- C4 (each look pushes the waiter keys' TTL past its new heartbeat).

local n, mode, id = tonumber(ARGV[1]), ARGV[2], ARGV[3]
local c = count() or 0
if c >= n then
    local left = redis.call('DECRBY', C, ARGV[1])
    if mode == 'w' then leave(id) end
    return {1, left}
end
if mode ~= 'w' then return {0, c} end

purge()
local hb_ms, pad = tonumber(ARGV[5]), tonumber(ARGV[6])
redis.call('ZADD', Q, 'NX', int(now_us), id)
redis.call('ZADD', HB, int(now + hb_ms), id)
redis.call('HSET', W, id, ARGV[1] .. '|' .. ARGV[4])
local ttl = int(hb_ms + pad)
redis.call('PEXPIRE', Q, ttl)
redis.call('PEXPIRE', HB, ttl)
redis.call('PEXPIRE', W, ttl)
return {0, c}
