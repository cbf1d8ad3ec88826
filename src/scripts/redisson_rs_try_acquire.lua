-- Redisson RSemaphore.tryAcquire(n) (RedissonSemaphore.java 265-274).
-- KEYS: 1 NAME (the counter)
-- ARGV: 1 n (>= 1), 2 the operation key's deadline or retention (with KEYS[2], the key: every
-- call of this library, see once.lua)
-- Reply: 1 when the counter existed and held >= n (then DECRBY n; a resent call that
-- took them: 1 again, taking nothing), else 0.
-- Errors (Redis does not undo a script's writes): n that is no integer from 1, of at
-- most 10 digits, is refused first (a negative one would add permits); a counter of
-- another type, or one that is not integer text, fails counter_value() with WRONGTYPE;
-- the DECRBY is the only write.
if not string.find(ARGV[1], '^[1-9]%d*$') or #ARGV[1] > 10 then
    return redis.error_reply('ERR permits must be an integer from 1, found ' .. string.sub(ARGV[1], 1, 40))
end
local done, bad = once_done(1)
if bad then return bad end
if done then return 1 end
local value = counter_value()
if value and value >= tonumber(ARGV[1]) then
    redis.call('DECRBY', KEYS[1], ARGV[1])
    once_record(1, '1')
    return 1
end
return 0
