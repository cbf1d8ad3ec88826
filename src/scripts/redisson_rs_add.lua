-- Redisson RSemaphore.addPermits(d) (RedissonSemaphore.java 594-604).
-- KEYS: 1 NAME (the counter), 2 redisson_sc:{NAME} (the channel)
-- ARGV: 1 publish command (redisson_publish.lua), 2 d (signed, non-zero), 3 the operation key's deadline or retention
-- (with KEYS[3], the key: every call of this library, see once.lua)
-- Reply: the counter after (a resent call: its first run's). The counter (missing = 0) + d is SET (dropping any TTL,
-- as Redisson's SET does) and the new value published.
-- Errors (Redis does not undo a script's writes): d that is no non-zero integer of at
-- most 10 digits is refused first; a counter of another type, or one that is not
-- integer text, fails counter_value() with WRONGTYPE, before the SET, the only write; the publish after it is sent with redis.pcall and its error ignored
-- (a refused PUBLISH/SPUBLISH: waiters also poll).
if not string.find(ARGV[2], '^%-?[1-9]%d*$') or #ARGV[2] > 11 then
    return redis.error_reply('ERR permits must be a non-zero integer, found ' .. string.sub(ARGV[2], 1, 40))
end
local done, bad = once_done(2)
if bad then return bad end
if done then return tonumber(done) end
local after = (counter_value() or 0) + tonumber(ARGV[2])
if not counter_fits(after) then
    return redis.error_reply(counter_refused(redis.call('GET', KEYS[1])))
end
redis.call('SET', KEYS[1], string.format('%d', after))
publish(KEYS[2], after)
once_record(2, string.format('%d', after))
return after
