-- Fast paths of the hot operations: a plain grant of one permit, a plain "no" to a
-- try, and a plain release, each with only the commands it needs. They run before
-- common.lua's machinery is even set up; whenever anything is not plain (the keys
-- missing or not agreeing, a waiter queued, an expired entry to purge, a repeated id,
-- several permits at once) they answer nil and write nothing, and the full logic
-- (common.lua, ops.lua) decides. Both give exactly the reply and the state the full
-- logic would give in the same case, and keep the same invariants (common.lua).
--
-- Failure points: none after the first write. Every key is read before anything is
-- written, each read a redis.pcall whose error (a key of another type) means "not
-- plain", so every write is to a key whose type a read has shown. Out of memory
-- refuses only a script's first write.

-- Whether this script has already seen the four keys exist with their types and agree
-- (h and q hold their sentinels, s has exactly 'used' bits set), and has kept them so
-- since. Within one script nobody else writes, so the fast operations of a batch check
-- the keys once: every fast write below keeps them agreeing, except a release whose
-- record names slots that were not set (a record edited by hand), which clears it, and
-- the idle release's DEL, which clears it too (fast_create checks that nothing exists).
local keys_agree = false

-- Grant one permit to `id` on a semaphore without keys (the HMGET `v` of I found no
-- 'exp'); nil when not plain: some key exists (the full logic repairs), or the
-- caller's limit is below 1. Creates the four keys as create() and grant() would:
-- slot 0, token now_us (max(ctr + 1, now_us) with ctr gone; see fast_release for why
-- it is above every token granted before), K1-K4 hold for one holder.
local function fast_create(id, climit, lease, pad, origin, v)
    for k = 2, 8 do
        if v[k] then return nil end
    end
    local limit = tonumber(climit)
    if not limit or limit < 1 or redis.call('EXISTS', H, I, S, Q) ~= 0 then return nil end
    local deadline = now + lease
    local e = int(deadline + pad)
    local d = int(deadline)
    local token = int(now_us)
    redis.call('ZADD', H, int(END_OF_TIME), '~', d, id)
    redis.call('ZADD', Q, int(END_OF_TIME), '~')
    redis.call('SETBIT', S, 0, 1)
    redis.call('HSET', I, 'used', 1, 'ctr', token, 'mind', d, 'exp', e, 'qn', 0, 'qseq', 0,
        'cl', climit, id, '1|' .. token .. '|0|' .. int(now) .. '|' .. origin)
    redis.call('PEXPIREAT', H, e)
    redis.call('PEXPIREAT', I, e)
    redis.call('PEXPIREAT', S, e)
    redis.call('PEXPIREAT', Q, e)
    keys_agree = true
    return {1, now, now_us, deadline, 0}
end

-- Grant one permit to `id`, or say "no" to a try; nil when not plain.
-- Plain: the four keys exist with their types and agree (anything else: the full
-- logic repairs, also before a "no"), the hash has no record for `id`, nobody is queued
-- ('qn' 0), and no deadline has passed ('mind' ahead, so nothing needs a purge).
-- Reply: op_acquire's {1, now, token, deadline, slot} or {0, now, retry, 0}.
local function fast_acquire(id, n, climit, lease, pad, mode, origin, cutoff)
    if n ~= 1 or not lease or not pad or (cutoff > 0 and now >= cutoff) then return nil end
    local v = redis.pcall('HMGET', I, 'exp', 'used', 'mind', 'ctr', 'limit', 'qn', 'cl', id)
    if v.err then return nil end
    if not v[1] then return fast_create(id, climit, lease, pad, origin, v) end
    if v[8] or (tonumber(v[6]) or 0) ~= 0 then return nil end
    local mind = tonumber(v[3]) or END_OF_TIME
    local used = tonumber(v[2])
    local limit = tonumber(v[5]) or tonumber(climit)
    if now >= mind or not used or not limit or limit < 1 then return nil end
    -- the other three keys exist with their types (h and q hold the sentinel '~', s
    -- is never empty) and agree (s has exactly `used` bits set, K2), else the full
    -- logic repairs; after these reads no command below can meet a key of another type
    if not keys_agree then
        local hs, qs, bits = redis.pcall('ZSCORE', H, '~'), redis.pcall('ZSCORE', Q, '~'), redis.pcall('BITCOUNT', S)
        if type(hs) ~= 'string' or type(qs) ~= 'string' or bits ~= used then return nil end
        if used == 0 and redis.call('STRLEN', S) == 0 then return nil end
        keys_agree = true
    end
    if used + 1 > limit then
        if mode ~= 't' then return nil end
        local retry = -1
        if mind < END_OF_TIME then retry = mind - now end
        return {0, now, retry, 0}
    end
    -- exactly `used` bits are set (K2) and used < limit, so the lowest clear bit is a
    -- slot below the limit (past the string's end when every bit in it is set)
    local b = redis.call('BITPOS', S, '0')
    local deadline = now + lease
    redis.call('ZADD', H, int(deadline), id)
    local slot = int(b)
    redis.call('SETBIT', S, slot, '1')
    local token = math.max((tonumber(v[4]) or 0) + 1, now_us)
    local f = {'used', int(used + 1), 'ctr', int(token),
        id, '1|' .. int(token) .. '|' .. slot .. '|' .. int(now) .. '|' .. origin}
    if deadline < mind then
        f[#f + 1] = 'mind'
        f[#f + 1] = int(deadline)
    end
    if v[7] ~= climit then
        f[#f + 1] = 'cl'
        f[#f + 1] = climit
        if v[7] then
            -- clients disagree on the limit: keep the other one for operators
            f[#f + 1] = 'cdl'
            f[#f + 1] = v[7]
        end
    end
    if (tonumber(v[1]) or 0) < deadline then
        local e = int(deadline + pad)
        f[#f + 1] = 'exp'
        f[#f + 1] = e
        redis.call('PEXPIREAT', H, e)
        redis.call('PEXPIREAT', I, e)
        redis.call('PEXPIREAT', S, e)
        redis.call('PEXPIREAT', Q, e)
    end
    redis.call('HSET', I, unpack(f))
    return {1, now, token, deadline, b}
end

-- Release `id`; nil when not plain.
-- Plain: the hash holds a record for `id`, nobody is queued (so nobody is served),
-- the four keys exist with their types and agree (h holds its sentinel and, when a
-- deadline may have passed, `id`; s has exactly 'used' bits set; q is a zset).
-- Reply: op_release's 1 (live) or 2 (its lease had ended).
--
-- Idle semaphores leave no keys behind: a holder's own release (not `keep`, which
-- force_release passes so that the holder it names learns LostReason::Released, not
-- Reset) that leaves nobody holding or queued, and no stored limit, deletes the four
-- keys instead of writing them, so an
-- idle semaphore costs no memory (its keys would otherwise stay until 'exp', about a
-- lease). Nothing is lost: there are no holders or waiters, 'qseq' orders only
-- waiters present, 'cl' is shown to operators only, and 'ctr' is needed only to keep
-- tokens increasing: the next token is at least the server's TIME in microseconds
-- then, so the keys are deleted only while 'ctr' is below now_us (a batch that
-- granted several tokens in one microsecond leaves the keys to their TTL).
local function fast_release(id, keep)
    local v = redis.pcall('HMGET', I, 'used', 'qn', id, 'limit', 'ctr', 'mind')
    if v.err or not v[3] or (tonumber(v[2]) or 0) ~= 0 or not tonumber(v[1]) then return nil end
    local p, slots = string.match(v[3], '^(%d+)|%d+|([%d,]*)|')
    if not p then return nil end
    -- live while now is before 'mind', a lower bound of every deadline in h (K3);
    -- else its deadline in h says (h must hold it: else the full logic repairs)
    local live = now < (tonumber(v[6]) or 0)
    if not live then
        local dl = redis.pcall('ZSCORE', H, id)
        if type(dl) ~= 'string' then return nil end
        live = tonumber(dl) > now
    end
    -- s agrees with 'used' (K2; so it exists, used >= p >= 1) and q is a zset
    if not keys_agree then
        local hs, bits = redis.pcall('ZSCORE', H, '~'), redis.pcall('BITCOUNT', S)
        if type(hs) ~= 'string' or bits ~= tonumber(v[1]) or redis.call('TYPE', Q)['ok'] ~= 'zset' then
            return nil
        end
        keys_agree = true
    end
    local used = tonumber(v[1]) - tonumber(p)
    if used < 0 then used = 0 end
    local reply = 2
    if live then reply = 1 end
    if not keep and used == 0 and not v[4] and (tonumber(v[5]) or 0) < now_us then
        -- idle: 'qn' is 0 and, by K2 and K4, h holds no holder or waiter but `id`
        redis.call('DEL', H, I, S, Q)
        keys_agree = false
        return reply
    end
    local cleared = 0
    for slot in string.gmatch(slots, '%d+') do
        cleared = cleared + redis.call('SETBIT', S, slot, '0')
    end
    -- a record that named slots not set (edited by hand) leaves 'used' and s apart:
    -- the next operation checks again, and the full logic repairs
    if cleared ~= tonumber(p) then keys_agree = false end
    redis.call('ZREM', H, id)
    redis.call('HDEL', I, id)
    redis.call('HSET', I, 'used', int(used))
    return reply
end
