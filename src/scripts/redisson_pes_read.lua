-- RPermitExpirableSemaphore availablePermits() (PES 754-769), getPermits() (772-793)
-- and acquiredPermits() (796-810): each reclaims every expired permit first (a read
-- that writes, as in Redisson).
-- ARGV: 3 'available' | 'permits' | 'acquired'
-- Reply: available: the counter (missing = 0); permits: counter + ZCOUNT 0 +inf
-- (missing counter = 0); acquired: ZCOUNT 0 +inf.
-- Errors (see the prelude): only reclaim writes, and its INCRBY comes first; once it
-- succeeded the counter is an integer, so counter_value() below cannot fail after a
-- write (without a reclaim nothing was written; then a counter of another type, or
-- not integer text, fails it with WRONGTYPE).
local bad = reclaim(nil)
if bad then return bad end
local what = ARGV[3]
if what == 'acquired' then
    return redis.call('ZCOUNT', KEYS[2], 0, '+inf')
end
local value = counter_value()
if value == false then
    return 0
end
if what == 'permits' then
    return value + redis.call('ZCOUNT', KEYS[2], 0, '+inf')
end
return value
