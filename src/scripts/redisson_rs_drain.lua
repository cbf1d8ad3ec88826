-- Redisson RSemaphore.drainPermits() (RedissonSemaphore.java 507-516).
-- KEYS: 1 NAME (the counter), 2 the operation key (every call of this library,
-- see once.lua; ARGV 1 its deadline or retention)
-- Reply: the counter before (0 when missing; then nothing is written; a resent call:
-- its first run's). The counter becomes 0. No publish.
-- Errors (Redis does not undo a script's writes): a counter of another type, or one
-- that is not integer text, fails counter_value() with WRONGTYPE, before the SET, the
-- only write.
local done, bad = once_done(1)
if bad then return bad end
if done then return tonumber(done) end
local before = counter_value()
if before == false then
    return 0
end
redis.call('SET', KEYS[1], 0)
once_record(1, string.format('%d', before))
return before
