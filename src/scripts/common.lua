-- Prelude shared by every redis-semaphore script: the Rust side concatenates it in
-- front of each script body, so each EVALSHA is still one self-contained script.
--
-- Key layout of semaphore NAME (every key carries the hash tag {NAME}, so a script
-- touches a single hash slot and runs unchanged on Redis Cluster):
--
--   KEYS[1]  redsem:{NAME}:h  zset    permit id -> lease deadline (server ms), plus the
--                                      member '~' scored END_OF_TIME, so the zset never
--                                      empties and never loses its TTL
--   KEYS[2]  redsem:{NAME}:i  hash    'used'  permits held by the holders in h
--                                      'ctr'   last fencing token granted
--                                      'limit' limit stored by set_limit (absent: the
--                                              caller's limit is used)
--                                      'exp'   expiry time (server ms) of all three keys
--                                      'mind'  lower bound of the earliest holder deadline
--                                      <id>    holder record, see below
--   KEYS[3]  redsem:{NAME}:s  string  bitmap: bit k is 1 while slot k is occupied
--
-- Holder record: "permits|token|slot,slot,...|acquired_ms|pid|host|label".
--
-- Invariants every script keeps (each script repeats the ones it relies on):
--   K1  The three keys exist together and expire together at 'exp'; 'exp' is at or
--       after every holder's deadline (no key without a TTL, none outlives its use by
--       more than the padding).
--   K2  'used' = sum of the permits of the holders in h = number of 1 bits in s.
--   K3  'mind' <= the earliest holder deadline; a purge makes it exact.
--   K4  Time is read once, from TIME, at the top of the script; nothing uses the
--       client's clock. A holder is live while now < deadline.
--   K5  Numbers handed to Redis go through int(): Lua would print 1.7e+15 otherwise.

local H, I, S = KEYS[1], KEYS[2], KEYS[3]
local END_OF_TIME = 9000000000000000
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local now_us = tonumber(t[1]) * 1000000 + tonumber(t[2])

local function int(x)
    return string.format('%.0f', x)
end

-- Reads the semaphore's state with one HMGET; `field` (a permit id) is read along.
local function load(field)
    local v = redis.call('HMGET', I, 'exp', 'used', 'mind', 'ctr', 'limit', field or 'exp')
    return {
        exists = v[1] ~= false,
        exp = tonumber(v[1]) or 0,
        used = tonumber(v[2]) or 0,
        mind = tonumber(v[3]) or END_OF_TIME,
        ctr = tonumber(v[4]) or 0,
        limit = tonumber(v[5]),
        rec = field and v[6] or false,
        dirty = false,
    }
end

-- Creates the keys of a semaphore that has none. Leftovers of a partial loss (a key
-- evicted or deleted by hand) are dropped first so that K1 and K2 hold again.
local function init(st)
    if st.exists then return end
    redis.call('DEL', H, S)
    redis.call('ZADD', H, END_OF_TIME, '~')
    redis.call('SETBIT', S, 0, 0)
    redis.call('HSET', I, 'used', 0)
    st.exists, st.exp, st.used, st.mind, st.dirty = true, 0, 0, END_OF_TIME, true
end

-- Keeps K1 when a deadline is added: when 'exp' would fall before `deadline`, push it
-- to deadline + pad. The padding makes this run about once per `pad` ms under load.
local function extend(st, deadline, pad)
    if st.exp >= deadline then return end
    st.exp = deadline + pad
    local e = int(st.exp)
    redis.call('PEXPIREAT', H, e)
    redis.call('PEXPIREAT', I, e)
    redis.call('PEXPIREAT', S, e)
    st.dirty = true
end

-- Frees the slots named in a holder record; returns its permit count.
local function free_slots(rec)
    local p, slots = string.match(rec, '^(%d+)|%d+|([%d,]*)|')
    for slot in string.gmatch(slots or '', '%d+') do
        redis.call('SETBIT', S, slot, 0)
    end
    return tonumber(p) or 0
end

-- Removes every holder whose deadline has passed (K2, K3). Costs nothing but a
-- comparison while now < 'mind'.
local function purge(st)
    if not st.exists or now < st.mind then return end
    while true do
        local ids = redis.call('ZRANGEBYSCORE', H, '-inf', now, 'LIMIT', 0, 256)
        if #ids == 0 then break end
        local recs = redis.call('HMGET', I, unpack(ids))
        for k = 1, #ids do
            if recs[k] then st.used = st.used - free_slots(recs[k]) end
        end
        redis.call('HDEL', I, unpack(ids))
        redis.call('ZREM', H, unpack(ids))
    end
    if st.used < 0 then st.used = 0 end
    local first = redis.call('ZRANGE', H, 0, 0, 'WITHSCORES')
    st.mind = tonumber(first[2]) or END_OF_TIME
    st.dirty = true
end

-- Parses "permits|token|slots|..." into the reply shape {permits, token, slot...}.
local function grant_reply(rec)
    local p, tok, slots = string.match(rec, '^(%d+)|(%d+)|([%d,]*)|')
    local out = {1, tonumber(tok)}
    for slot in string.gmatch(slots, '%d+') do out[#out + 1] = tonumber(slot) end
    return out
end

