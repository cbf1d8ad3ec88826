-- Redisson RSemaphore.drainPermits() (RedissonSemaphore.java 507-516).
-- KEYS: 1 NAME (the counter)
-- Reply: the counter before (0 when missing; then nothing is written). The counter
-- becomes 0. No publish.
local value = redis.call('GET', KEYS[1])
if value == false then
    return 0
end
redis.call('SET', KEYS[1], 0)
return tonumber(value)
