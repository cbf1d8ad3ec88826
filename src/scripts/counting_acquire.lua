-- counting acquire (P): take ARGV[1] permits if the count has them, else (mode 'w')
-- queue the caller to be told when to look again.
--
-- ARGV: 1 n (>= 1), 2 mode ('t' try: never queued; 'w' wait: queued when not
--       granted, its heartbeat renewed), 3 waiter id, 4 the waiter's wake-up channel,
--       5 heartbeat ms (>= 1), 6 key padding ms (>= 0), 7 operation key's deadline or retention
--       ms (with KEYS[5] only)
-- Reply: {1, count after}   granted: the count was >= n and went down by n (a resent
--                           call that was granted: its first run's reply, C7)
--        {0, count}         not now (count < n; an unset semaphore reads 0)
--
-- Keeps: C2 (DECRBY only when count >= n, so never below 0 and never while <= 0);
-- C3 (a granted waiter leaves the queue; a waiting one is in all three waiter keys,
-- with its first arrival kept, so it does not lose its place by looking again);
-- C4 (each look pushes the waiter keys' TTL past its new heartbeat).
-- Every argument a waiter's look uses is checked before the first write (a granted
-- look parses heartbeat and pad for nothing; a plain try parses only n).

local n, mode, id = arg_int(ARGV[1], 1, 'n'), ARGV[2], ARGV[3]
local hb_ms, pad
if mode == 'w' then
    if id == nil or ARGV[4] == nil then
        error('invalid argument: a waiter needs an id and a channel', 0)
    end
    hb_ms, pad = arg_int(ARGV[5], 1, 'heartbeat ms'), arg_int(ARGV[6], 0, 'pad ms')
end
local done, bad_once = once_done(4, now)
if bad_once then return bad_once end
if done then return {1, tonumber(done)} end
fix_waiter_keys()
local c = count() or 0
if c >= n then
    local left = redis.call('DECRBY', C, int(n))
    if mode == 'w' then leave(id) end
    once_record(4, int(left))
    return {1, left}
end
if mode ~= 'w' then return {0, c} end

purge()
redis.call('ZADD', Q, 'NX', int(now_us), id)
redis.call('ZADD', HB, int(now + hb_ms), id)
redis.call('HSET', W, id, int(n) .. '|' .. ARGV[4])
local ttl = int(hb_ms + pad)
redis.call('PEXPIRE', Q, ttl)
redis.call('PEXPIRE', HB, ttl)
redis.call('PEXPIRE', W, ttl)
return {0, c}
