-- Redisson RSemaphore.tryAcquire(n) (RedissonSemaphore.java 265-274).
-- KEYS: 1 NAME (the counter)
-- ARGV: 1 n (>= 1)
-- Reply: 1 when the counter existed and held >= n (then DECRBY n), else 0.
-- Errors (Redis does not undo a script's writes): a counter of another type fails the
-- GET, one that is not a number (or a bad n) the comparison; the DECRBY is the only
-- write, and when it is refused it writes nothing.
local value = redis.call('GET', KEYS[1])
if value ~= false and tonumber(value) >= tonumber(ARGV[1]) then
    redis.call('DECRBY', KEYS[1], ARGV[1])
    return 1
end
return 0
