-- The fast grant and "no" (see fast.lua, whose state it uses), and the check of an
-- acquire's arguments that every acquiring script runs before its first write.

-- An acquire's arguments are ARGV[j] on (acquire.lua's ARGV 2-10: permits, the
-- caller's limit, lease, pad, heartbeat, origin, mode, fair, channel); the acquires of
-- a batch may share them (batch.lua's 'A'). fast_numbers(j, all) parses the caller's
-- limit and, with `all`, the lease and the pad, once for consecutive calls with the
-- same j (and not at all after check_acquire(j) parsed them); nil for what is not a
-- valid one (int_arg), which makes the call not plain: the full logic refuses it
-- before its first write (acquire.lua, batch_entry.lua).
local pn_j, pn_all, pn_limit, pn_lease, pn_pad = 0, false, nil, nil, nil
local function fast_numbers(j, all)
    if pn_j ~= j then
        pn_j, pn_all, pn_limit = j, false, int_arg(ARGV[j + 1], 1, MAX_LIMIT)
    end
    if all and not pn_all then
        pn_all, pn_lease, pn_pad = true, int_arg(ARGV[j + 2], 1, MAX_MS), int_arg(ARGV[j + 3], 1, MAX_MS)
    end
    return pn_limit, pn_lease, pn_pad
end

-- What is wrong with an acquire's arguments from ARGV[j] on (acquire.lua's ARGV 2-10:
-- permits, the caller's limit, lease, pad, heartbeat, origin, mode, fair, channel), or
-- nil when nothing is; run before the first write of every script that acquires.
-- What it parses it leaves to fast_numbers (the same int_arg checks, so the same
-- values).
local function check_acquire(j)
    if not int_arg(ARGV[j], 1, MAX_LIMIT) then return 'bad permit count' end
    local limit = int_arg(ARGV[j + 1], 1, MAX_LIMIT)
    if not limit then return 'bad limit' end
    local lease, pad = int_arg(ARGV[j + 2], 1, MAX_MS), int_arg(ARGV[j + 3], 1, MAX_MS)
    if not (lease and pad and int_arg(ARGV[j + 4], 1, MAX_MS)) then
        return 'bad lease, pad or heartbeat'
    end
    if not ARGV[j + 5] or not ARGV[j + 8] then return 'missing origin or channel' end
    pn_j, pn_all, pn_limit, pn_lease, pn_pad = j, true, limit, lease, pad
    return nil
end

-- Grant one permit to `id`, or say "no" to a try; nil when not plain. The other
-- arguments are ARGV[j] on (see fast_numbers), `n` is ARGV[j] parsed, `cutoff` server
-- ms (0: none).
-- Plain: the hash holds the state and no record for `id`, nobody is queued ('qn' 0),
-- and no deadline has passed ('mind' ahead, so nothing needs a purge); for a grant
-- also the other three keys exist with their types and agree (anything else: the
-- full logic repairs, or refuses a key of another type); or no key exists at all
-- (the create branch). A "no" to a try
-- reads only the hash (see below).
-- Reply (short forms of op_acquire's, which the client reads as those):
--   'now|token|deadline|slot'  granted: op_acquire's {1, now, token, deadline, slot}
--   0                          a try refused: op_acquire's {0, now, retry, 0} without
--                              the time and the retry, which a try does not use
-- A table reply costs the server about 4,000-8,000 instructions more than these (its
-- creation, and the conversion of a nested array: measured with
-- scripts/server-instructions.sh), and a batch carries several.
local function fast_acquire(id, n, j, cutoff)
    if n ~= 1 or damaged or (cutoff > 0 and now >= cutoff) then return nil end
    local rec = fast_state(id)
    if rec == nil then return nil end
    local v = fv
    if not v[1] then
        -- Create: a semaphore without keys (the hash has none of its fields and no
        -- record for `id`); not plain when some key exists (the full logic repairs)
        -- or the caller's limit is below 1. Creates h, i and s as create() and
        -- grant() would: slot 0, token now_us (max(ctr + 1, now_us) with ctr gone;
        -- see fast_release for why it is above every token granted before), K1-K4
        -- hold for one holder.
        if rec or v[2] or v[3] or v[4] or v[5] or v[6] or v[7] then return nil end
        local limit, lease, pad = fast_numbers(j, true)
        if not limit or not lease or not pad or not ARGV[j + 5] then return nil end
        if redis.call('EXISTS', H, I, S, Q) ~= 0 then return nil end
        local deadline = now + lease
        local e = int(deadline + pad)
        local d = int(deadline)
        local token = int(now_us)
        redis.call('ZADD', H, int(END_OF_TIME), '~', d, id)
        -- the slot bitmap with slot 0 set (bit 0 is the high bit of the first byte, as
        -- SETBIT counts), written with its TTL in one command (PXAT: Redis 6.2)
        redis.call('SET', S, '\128', 'PXAT', e)
        redis.call('HSET', I, 'used', 1, 'ctr', token, 'mind', d, 'exp', e, 'qn', 0, 'qseq', 0,
            'cl', ARGV[j + 1], id, '1|' .. token .. '|0|' .. int(now) .. '|' .. ARGV[j + 5])
        redis.call('PEXPIREAT', H, e)
        redis.call('PEXPIREAT', I, e)
        keys_agree = true
        v[1], v[2], v[3], v[4] = deadline + pad, 1, deadline, now_us
        v[5], v[6], v[7], v[8] = false, 0, ARGV[j + 1], false
        return int(now) .. '|' .. token .. '|' .. d .. '|0'
    end
    if rec or v[6] ~= 0 then return nil end
    local used, limit = v[2], v[5]
    if not limit then limit = fast_numbers(j) end
    if now >= v[3] or not used or not limit or limit < 1 then return nil end
    if used + 1 > limit then
        -- a "no" writes nothing and needs only the hash: it is given before the
        -- other keys are read (were they damaged, the full logic's repair would drop
        -- every holder, so a "no" is the safer answer; the next grant, release or
        -- blocking acquire, or the next deadline ('mind'), makes the full logic run)
        if ARGV[j + 6] ~= 't' then return nil end
        return 0
    end
    -- h and s exist with their types (h holds the sentinel '~', s is never empty)
    -- and agree (s has exactly `used` bits set, K2), else the full logic repairs;
    -- after these reads no command below can meet a key of another type (q is not
    -- read: nobody queues, so nothing in it is needed, K1)
    if not keys_agree then
        local hs, bits = redis.pcall('ZSCORE', H, '~'), redis.pcall('BITCOUNT', S)
        if type(hs) ~= 'string' or bits ~= used then return nil end
        if used == 0 and redis.call('STRLEN', S) == 0 then return nil end
        keys_agree = true
    end
    local _, lease, pad = fast_numbers(j, true)
    if not lease or not pad or not ARGV[j + 5] then return nil end
    -- a grant that must move the keys' expiry of a semaphore with a stored limit
    -- keeps the limit for its retention (extend, common.lua): the full logic does
    -- it, about once a retention
    if v[5] and (tonumber(v[1]) or 0) < now + lease then return nil end
    -- exactly `used` bits are set (K2) and used < limit, so the lowest clear bit is a
    -- slot below the limit (past the string's end when every bit in it is set)
    local b = redis.call('BITPOS', S, '0')
    local deadline = now + lease
    local d = int(deadline)
    redis.call('ZADD', H, d, id)
    local slot = int(b)
    redis.call('SETBIT', S, slot, '1')
    local token = math.max((int_arg(v[4], 0, MAX_TOKEN) or 0) + 1, now_us)
    local t = int(token)
    local nt = int(now)
    local rec = '1|' .. t .. '|' .. slot .. '|' .. nt .. '|' .. ARGV[j + 5]
    local climit = ARGV[j + 1]
    local exp = tonumber(v[1]) or 0
    v[1] = exp
    if deadline >= v[3] and v[7] == climit and exp >= deadline then
        -- (the usual grant: no other field changes, so no list of them to build)
        redis.call('HSET', I, 'used', int(used + 1), 'ctr', t, id, rec)
    else
        local f = {'used', int(used + 1), 'ctr', t, id, rec}
        if deadline < v[3] then
            v[3] = deadline
            f[#f + 1] = 'mind'
            f[#f + 1] = d
        end
        if v[7] ~= climit then
            f[#f + 1] = 'cl'
            f[#f + 1] = climit
            if v[7] then
                -- clients disagree on the limit: keep the other one for operators
                f[#f + 1] = 'cdl'
                f[#f + 1] = v[7]
            end
            v[7] = climit
        end
        if exp < deadline then
            v[1] = deadline + pad
            local e = int(v[1])
            f[#f + 1] = 'exp'
            f[#f + 1] = e
            redis.call('PEXPIREAT', H, e)
            redis.call('PEXPIREAT', I, e)
            redis.call('PEXPIREAT', S, e)
        end
        redis.call('HSET', I, unpack(f))
    end
    v[2], v[4], v[8] = used + 1, token, false
    return nt .. '|' .. t .. '|' .. d .. '|' .. slot
end
