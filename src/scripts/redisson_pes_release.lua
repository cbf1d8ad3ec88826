-- RPermitExpirableSemaphore.tryRelease(id) (PES 612-632).
-- ARGV: 3 the id (16 raw bytes), 4 the same id as 32-char hex text, or '' (also
--       accept the pre-3.17 hex member), 5 the operation key's deadline or retention (with KEYS[4],
--       the key: Redis Cluster, see once.lua)
-- Reply: 1 released while its lease ran; 2 released, but its deadline had passed
--        (Redisson's false: it was expired, not yet reclaimed); 0 not in the zset (a
--        resent call that released it: its first run's reply).
-- The counter goes up by one and the new value is published (by Redisson's steps,
-- whatever the deadline).
-- Errors (see the prelude): the zset's type fails ZSCORE; the deadline comparison is
-- made before any write; the INCRBY comes before the ZREM (Redisson ZREMs first:
-- the same effect, as ZSCORE proved the member there), so a counter of another type
-- is a WRONGTYPE error reply with the zset unchanged. Then only ZREM (of a member just
-- read) and the publish (pcall) follow.
local done, bad_once = once_done(3)
if bad_once then return bad_once end
if done then return tonumber(done) end
local member = ARGV[3]
local expire = redis.call('ZSCORE', KEYS[2], member)
if expire == false and ARGV[4] ~= '' then
    member = ARGV[4]
    expire = redis.call('ZSCORE', KEYS[2], member)
end
if expire == false then
    return 0
end
local late = tonumber(expire) <= tonumber(NOW)
local value, bad = incr(1)
if bad then return bad end
redis.call('ZREM', KEYS[2], member)
publish(KEYS[3], value)
local reply = 1
if late then reply = 2 end
once_record(3, tostring(reply))
return reply
