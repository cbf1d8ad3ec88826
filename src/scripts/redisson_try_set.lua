-- Redisson trySetPermits(p) and trySetPermits(p, ttl) (RedissonSemaphore.java 534-586;
-- RedissonPermitExpirableSemaphore.java 843-854, the same steps).
-- KEYS: 1 NAME (the counter), 2 redisson_sc:{NAME} (the channel)
-- ARGV: 1 publish command, 2 p (>= 0), 3 ttl ms ('' for none)
-- Reply: 1 when the counter was absent (now SET to p, with PX ttl when given, and p
-- published), else 0 (a counter at 0 counts as existing, as since Redisson 3.16.3).
if redis.call('EXISTS', KEYS[1]) == 1 then
    return 0
end
if ARGV[3] ~= '' then
    redis.call('SET', KEYS[1], ARGV[2], 'PX', ARGV[3])
else
    redis.call('SET', KEYS[1], ARGV[2])
end
redis.call(ARGV[1], KEYS[2], ARGV[2])
return 1
