-- RPermitExpirableSemaphore updateLeaseTime(id, lease) (PES 876-897) and
-- getLeaseTime(id) (905-935): each reclaims every expired permit first.
-- ARGV: update: 3 'update' (or 'renew'), 4 the new deadline (client ms, or NO_LEASE),
--       5.. the ids (16 raw bytes each; Redisson sends one, the background renewal a
--       chunk of at most 1,000: src/refresher.rs);
--       get: 3 'get', 4 the id.
-- update: for each id, 1 when it is still in the zset (now scored with the new
-- deadline), else 0; then the lease zset's PTTL (-1: no TTL), which ends every lease
-- in it when it expires (a counter's TTL, copied by the acquire). 'renew' (this client's renewals of its own permits, in the
-- background and by Permit::refresh) never moves a deadline earlier (ZADD GT): a
-- renewal held up on its way (its call gave up, and the one sent after it was
-- answered) may land after a later one, and must not end the lease that one's client
-- counts on ('update', Redisson's updateLeaseTime, sets the deadline it is given).
-- get: {0} absent; {1, -1} no lease; {1, ms left} (deadline - now).
-- Errors (see the prelude): the new deadline (update) or now and the id (get) are
-- checked before reclaim, whose read proves the zset's type; reclaim is the only write
-- before the ZADDs and the get's ZSCORE, so neither they nor the subtraction can fail
-- after a write. (A get without its id, a direct call with an argument missing, used
-- to reclaim first and then fail at its ZSCORE of nil.)
local now
local renew = ARGV[3] == 'renew'
if ARGV[3] == 'update' or renew then
    if not string.find(ARGV[4], '^%-?%d+$') or #ARGV[4] > 20 then
        return redis.error_reply('ERR the lease deadline must be integer ms, found ' .. string.sub(ARGV[4], 1, 40))
    end
else
    now = tonumber(NOW)
    if now == nil then
        return redis.error_reply('ERR now must be a number of ms, found ' .. string.sub(tostring(NOW), 1, 40))
    end
    if ARGV[3] ~= 'get' or ARGV[4] == nil or #ARGV ~= 4 then
        return redis.error_reply('ERR the lease read takes get and one id')
    end
end
local bad = reclaim(nil)
if bad then return bad end
if ARGV[3] == 'update' or renew then
    local held = {}
    for i = 5, #ARGV do
        if redis.call('ZSCORE', KEYS[2], ARGV[i]) == false then
            held[i - 4] = 0
        elseif renew then
            redis.call('ZADD', KEYS[2], 'GT', ARGV[4], ARGV[i])
            held[i - 4] = 1
        else
            redis.call('ZADD', KEYS[2], ARGV[4], ARGV[i])
            held[i - 4] = 1
        end
    end
    held[#ARGV - 3] = redis.call('PTTL', KEYS[2])
    return held
end
local score = redis.call('ZSCORE', KEYS[2], ARGV[4])
if score == false then
    return {0}
end
if tonumber(score) == tonumber(NO_LEASE) then
    return {1, -1}
end
return {1, tonumber(score) - now}
