-- PROTOTYPE, for measurement only (scripts/onekey-instructions.sh; BENCHMARKS.md): W2's
-- batch (tries and releases of one permit) on one hash per semaphore. Not used by the
-- library; the fast path only, so it answers an error where the real one falls back.
-- Layout: K's field '.' = "used|ctr|mind|exp|qn|cl"; 'b' = slot bitmap (SETBIT layout);
--    <id> = "permits|token|slots|acquired|deadline|origin"
-- ARGV as batch.lua: r <id> | a <id> n limit lease pad hb origin mode fair channel cutoff | A <id> cutoff
local K = KEYS[1]
if not K then return redis.error_reply('ERR one key expected') end
local MAX_LIMIT = 10000
local MAX_MS = 10000000000000
local t = redis.call('TIME')
local t_s, t_us = tonumber(t[1]), tonumber(t[2])
local now = t_s * 1000 + math.floor(t_us / 1000)
local now_us = t_s * 1000000 + t_us
local function int(x) return string.format('%d', x) end
local function int_arg(x, lo, hi)
    local v = tonumber(x)
    if v and v == math.floor(v) and v >= lo and v <= hi then return v end
    return nil
end
local function valid_id(id)
    return type(id) == 'string' and #id == 36 and string.find(id, '^[0-9a-f%-A-F]+$') ~= nil
end
-- first pass: check every operation (as batch_entry.lua)
local count = 0
do
    local k, shared = 1, false
    while k <= #ARGV do
        local tag = ARGV[k]
        if tag ~= 'a' and tag ~= 'r' and not (tag == 'A' and shared) then
            return redis.error_reply('ERR batch: unknown operation')
        end
        if not valid_id(ARGV[k + 1]) then return redis.error_reply('ERR not a permit id') end
        count = count + 1
        if tag == 'a' then
            if not int_arg(ARGV[k + 2], 1, MAX_LIMIT) or not int_arg(ARGV[k + 3], 1, MAX_LIMIT)
                or not int_arg(ARGV[k + 4], 1, MAX_MS) or not int_arg(ARGV[k + 5], 1, MAX_MS)
                or not int_arg(ARGV[k + 6], 1, MAX_MS) then
                return redis.error_reply('ERR bad acquire')
            end
            shared = true
            k = k + 12
        elseif tag == 'A' then k = k + 3 else k = k + 2 end
    end
end
-- the state, read with the first operation's record
local st, bits, first = nil, nil, nil
local used, ctr, mind, exp, qn, cl
local dirty = false
local function rec_of(id)
    if st then return redis.call('HGET', K, id) end
    local v = redis.call('HMGET', K, '.', 'b', id)
    st, bits = v[1], v[2] or ''
    if st then
        local a, b, c, d, e, f = string.match(st, '^(%d+)|(%d+)|(%d+)|(%d+)|(%d+)|(.*)$')
        used, ctr, mind, exp, qn, cl = tonumber(a), b, tonumber(c), d, tonumber(e), f
    end
    return v[3]
end
local out = {}
local k, j, i = 1, 0, 1
while i <= count do
    local tag, reply = ARGV[k], nil
    if tag == 'r' then
        local id = ARGV[k + 1]
        local rec = rec_of(id)
        if not rec or not st then return redis.error_reply('ERR not plain') end
        local p, slots, dl = string.match(rec, '^(%d+)|%d+|([%d,]*)|%d+|(%d+)|')
        p = tonumber(p)
        for slot in string.gmatch(slots, '%d+') do
            local s = tonumber(slot)
            local byte = math.floor(s / 8) + 1
            local b = string.byte(bits, byte)
            local m = 2 ^ (7 - s % 8)
            b = bit.band(b, bit.bnot(m)) % 256
            bits = string.sub(bits, 1, byte - 1) .. string.char(b) .. string.sub(bits, byte + 1)
        end
        redis.call('HDEL', K, id)
        used = used - p
        dirty = true
        if tonumber(dl) > now then reply = 1 else reply = 2 end
        k = k + 2
    else
        local id, cutoff
        if tag == 'a' then j, cutoff = k + 2, ARGV[k + 11]; k = k + 12 else cutoff = ARGV[k + 2]; k = k + 3 end
        id = ARGV[k - (tag == 'a' and 12 or 3) + 1]
        local rec = rec_of(id)
        if rec or not st or qn ~= 0 or now >= mind then return redis.error_reply('ERR not plain') end
        local limit = tonumber(ARGV[j + 1])
        if used + 1 > limit then
            reply = 0
        else
            local lease, pad = tonumber(ARGV[j + 2]), tonumber(ARGV[j + 3])
            -- lowest clear bit
            local byte = string.find(bits, '[^\255]')
            local slot
            if not byte then
                slot = #bits * 8
                bits = bits .. '\128'
            else
                local b = string.byte(bits, byte)
                local n = 0
                while bit.band(b, 2 ^ (7 - n)) ~= 0 do n = n + 1 end
                slot = (byte - 1) * 8 + n
                b = bit.bor(b, 2 ^ (7 - n))
                bits = string.sub(bits, 1, byte - 1) .. string.char(b) .. string.sub(bits, byte + 1)
            end
            local deadline = now + lease
            local d = int(deadline)
            local token = math.max((tonumber(ctr) or 0) + 1, now_us)
            local tk = int(token)
            ctr = tk
            local nt = int(now)
            redis.call('HSET', K, id, '1|' .. tk .. '|' .. slot .. '|' .. nt .. '|' .. d .. '|' .. ARGV[j + 5])
            used = used + 1
            if deadline < mind then mind = deadline end
            if tonumber(exp) < deadline then
                exp = int(deadline + pad)
                redis.call('PEXPIREAT', K, exp)
            end
            dirty = true
            reply = nt .. '|' .. tk .. '|' .. d .. '|' .. slot
        end
    end
    out[i] = reply
    i = i + 1
end
if dirty then
    redis.call('HSET', K, '.', int(used) .. '|' .. ctr .. '|' .. int(mind) .. '|' .. exp .. '|' .. int(qn) .. '|' .. cl, 'b', bits)
end
return out
