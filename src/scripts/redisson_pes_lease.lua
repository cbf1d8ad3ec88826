-- RPermitExpirableSemaphore updateLeaseTime(id, lease) (PES 876-897) and
-- getLeaseTime(id) (905-935): each reclaims every expired permit first.
-- ARGV: 3 'update' | 'get', 4 the id (16 raw bytes), 5 (update) the new deadline
--       (client ms, or NO_LEASE)
-- update: 1 when the id is still in the zset (now scored with the new deadline), else 0.
-- get: {0} absent; {1, -1} no lease; {1, ms left} (deadline - now).
-- Errors (see the prelude): the new deadline (update) or now (get) is checked before
-- reclaim, the only write before the ZADD, so neither the ZADD nor the subtraction
-- can fail after a write.
local now
if ARGV[3] == 'update' then
    if not string.find(ARGV[5], '^%-?%d+$') then
        return redis.error_reply('ERR the lease deadline must be integer ms, found ' .. string.sub(ARGV[5], 1, 40))
    end
else
    now = tonumber(NOW)
    if now == nil then
        return redis.error_reply('ERR now must be a number of ms, found ' .. string.sub(NOW, 1, 40))
    end
end
local bad = reclaim(nil)
if bad then return bad end
local score = redis.call('ZSCORE', KEYS[2], ARGV[4])
if ARGV[3] == 'update' then
    if score == false then
        return 0
    end
    redis.call('ZADD', KEYS[2], ARGV[5], ARGV[4])
    return 1
end
if score == false then
    return {0}
end
if tonumber(score) == tonumber(NO_LEASE) then
    return {1, -1}
end
return {1, tonumber(score) - now}
