-- RPermitExpirableSemaphore.tryAcquire(n, lease) (PES 355-422).
-- ARGV: 3 n (>= 1), 4 deadline (client ms, or NO_LEASE), 5.. the n ids (16 raw bytes)
-- Reply: 'OK' granted (the ids are in the lease zset with the deadline); 'OK:<ms>'
--        granted, and the lease zset expires in <ms> (its PTTL: the counter's TTL,
--        copied as Redisson copies it), which ends the ids' leases with it;
--        ':<ms>' not now, the nearest lease deadline (a timed retry);
--        nil not now, and no lease will end (wait for a message).
-- Errors (see the prelude): the deadline is checked to be integer text of at most 19
-- digits first (a pattern, cheaper than tonumber; a longer one would be no finite
-- score), so the ZADDs after DECRBY cannot fail; n must be an integer from 1 to
-- 10,000 with exactly n ids after it (a negative n would reclaim without bound and
-- add permits, a mismatch hold more ids than permits taken); a bad counter fails
-- reclaim's INCRBY, or the GET, or DECRBY, each with nothing written yet.
if not string.find(ARGV[4], '^%-?%d+$') or #ARGV[4] > 20 then
    return redis.error_reply('ERR the lease deadline must be integer ms, found ' .. string.sub(ARGV[4], 1, 40))
end
if not string.find(ARGV[3], '^[1-9]%d?%d?%d?%d?$') or tonumber(ARGV[3]) > 10000
    or #ARGV - 4 ~= tonumber(ARGV[3]) then
    return redis.error_reply('ERR permits must be an integer from 1 to 10000 with as many ids, found '
        .. string.sub(ARGV[3], 1, 40))
end
-- The ids are new, made by the client for this call: when one of them is already in
-- the lease zset, this is a resend of a call that was granted (the cluster client
-- resends a command whose reply is late; the library sends a call again on another
-- connection when its own broke, perhaps after it ran), and it takes nothing again. Any of
-- them, not the first alone: between the two runs some of the ids may have been
-- released by id or reclaimed (reclaim takes at most n expired members), and
-- granting again would then take n permits for the ones put back (the others, still
-- held, are only scored again).
local function granted()
    local left = redis.call('PTTL', KEYS[2])
    if left > 0 then return 'OK:' .. left end
    return 'OK'
end
for i = 5, #ARGV do
    if redis.call('ZSCORE', KEYS[2], ARGV[i]) then
        return granted()
    end
end
local bad = reclaim(ARGV[3])
if bad then return bad end
local value = counter_value()
if value and value >= tonumber(ARGV[3]) then
    redis.call('DECRBY', KEYS[1], ARGV[3])
    for i = 5, #ARGV do
        redis.call('ZADD', KEYS[2], ARGV[4], ARGV[i])
    end
    local ttl = redis.call('PTTL', KEYS[1])
    if ttl > 0 then
        redis.call('PEXPIRE', KEYS[2], ttl)
    end
    return granted()
end
local first = redis.call('ZRANGE', KEYS[2], 0, 0, 'WITHSCORES')
if first[1] ~= nil and tonumber(first[2]) ~= tonumber(NO_LEASE) then
    return ':' .. first[2]
end
return nil
