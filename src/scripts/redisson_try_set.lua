-- Redisson trySetPermits(p) and trySetPermits(p, ttl) (RedissonSemaphore.java 534-586;
-- RedissonPermitExpirableSemaphore.java 843-854, the same steps).
-- KEYS: 1 NAME (the counter), 2 redisson_sc:{NAME} (the channel)
-- ARGV: 1 publish command (redisson_publish.lua), 2 p (>= 0), 3 ttl ms ('' for none), 4 the operation key's
-- retention (with KEYS[3], the key: every call of this library, see once.lua)
-- Reply: 1 when the counter was absent (now SET to p, with PX ttl when given, and p
-- published; a resent call that set it: 1 again), else 0 (a counter at 0 counts as
-- existing, as since Redisson 3.16.3).
-- Errors (Redis does not undo a script's writes): the SET is the only write, and a bad
-- ttl makes it fail with nothing written (a key of any type counts as existing, as in
-- Redisson); the publish after it is sent with redis.pcall and its error ignored (a
-- refused PUBLISH/SPUBLISH: waiters also poll). p is stored as sent, as Redisson
-- does: the Rust side sends a u32.
local done, bad = once_done(2)
if bad then return bad end
if done then return 1 end
if redis.call('EXISTS', KEYS[1]) == 1 then
    return 0
end
if ARGV[3] ~= '' then
    redis.call('SET', KEYS[1], ARGV[2], 'PX', ARGV[3])
else
    redis.call('SET', KEYS[1], ARGV[2])
end
publish(KEYS[2], ARGV[2])
once_record(2, '1')
return 1
