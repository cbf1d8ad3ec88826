-- RPermitExpirableSemaphore.tryRelease(id) (PES 612-632).
-- ARGV: 3 the id (16 raw bytes), 4 the same id as 32-char hex text, or '' (also
--       accept the pre-3.17 hex member)
-- Reply: 1 released while its lease ran; 2 released, but its deadline had passed
--        (Redisson's false: it was expired, not yet reclaimed); 0 not in the zset.
-- The counter goes up by one and the new value is published (by Redisson's steps,
-- whatever the deadline).
local member = ARGV[3]
local expire = redis.call('ZSCORE', KEYS[2], member)
if expire == false and ARGV[4] ~= '' then
    member = ARGV[4]
    expire = redis.call('ZSCORE', KEYS[2], member)
end
if expire == false or redis.call('ZREM', KEYS[2], member) ~= 1 then
    return 0
end
local value = redis.call('INCRBY', KEYS[1], 1)
redis.call(PUB, KEYS[3], value)
if tonumber(expire) <= tonumber(NOW) then
    return 2
end
return 1
