-- Prelude shared by the scripts of the ownerless counting semaphore (CountingSemaphore,
-- Redisson's RSemaphore, Dijkstra's P/V). The Rust side concatenates it in front of
-- each counting_*.lua body, so each EVALSHA is still one self-contained script.
--
-- Key layout of counting semaphore NAME (one hash tag {NAME}: one hash slot, so every
-- script runs unchanged on Redis Cluster):
--
--   KEYS[1]  redsem:{NAME}:count  string  the count of free permits (absent: unset,
--                                          read as 0). NO TTL, by design: it is the
--                                          semaphore's whole state, and nothing else
--                                          could bring it back.
--   KEYS[2]  redsem:{NAME}:cq     zset    waiter id -> arrival (server us): the queue
--   KEYS[3]  redsem:{NAME}:ch     zset    waiter id -> heartbeat deadline (server ms)
--   KEYS[4]  redsem:{NAME}:cw     hash    waiter id -> "n|channel"
--   KEYS[5]  redsem:{NAME}:op:<uuid>  string  (only for the scripts that change the
--                                          count; every call of this library) this
--                                          call's operation key: see once.lua
--
-- The three waiter keys only tell blocked acquires when to look again; no permit is
-- ever handed to a waiter through them, so losing them loses no permit (a waiter also
-- looks again on a bounded timer, and each look puts it back in the queue).
--
-- Invariants every script keeps:
--   C1  The count is an integer in [-MAX, MAX] (MAX = 2^32 - 1); a change that would
--       leave that range is refused with a RANGE error, before anything is written.
--   C2  The count goes down through an acquire only when it is >= n before: an
--       acquire never takes it below 0, and never succeeds while it is <= 0
--       (only reduce/add with a negative delta may push it below 0, as a debt).
--   C3  A waiter id is in cq, ch and cw together or in none of them.
--   C4  The waiter keys expire (at most heartbeat + pad after the last look of any
--       waiter); the count key never gets a TTL from these scripts.
--   C5  Every increase of the count (release, add, try_set) tells queued waiters whose
--       request fits in the new count, in arrival order, to look again ("L id" on
--       their client's channel). Nothing waits on a message: a lost one costs a
--       waiter at most its re-check interval.
--   C6  Time is read once, from TIME, here; a waiter is live while now < its
--       heartbeat deadline, and dead waiters are purged before waking anyone.
--   C7  With an operation key (KEYS[5], every call of this library), one call
--       changes the count at most once, however often it is sent (the cluster client
--       resends a late one; the client sends one whose connection broke again;
--       once.lua, which comes before this prelude).

--
-- Failure points. Redis does not undo a script's writes, so every script fails before
-- its first write or runs to its end. Each body first checks its arguments, then
-- calls fix_waiter_keys(), then reads the count, and only then writes:
--   - an argument missing, not an integer (1.5, nan, inf) or out of its range: the
--     body's checks (arg_int) fail first, before fix_waiter_keys() could delete
--     anything; a number is written back formatted by int(), never as sent;
--   - the count key of another type, or not an integer: count() fails, and every
--     script reads the count before it writes;
--   - a waiter key of another type: fix_waiter_keys() deletes it before anything else
--     (the waiter keys hold only wake-up hints, so no permit is lost; waiters put
--     themselves back at their next look), and wake() touches none of the keys it
--     deleted again (a node of a slot open for migration would refuse that, below);
--   - a change out of range: check_range() fails before the write;
--   - out of memory: Redis refuses only a script's first write;
--   - PUBLISH refused by ACL: sent with redis.pcall, its error ignored (a waiter also
--     looks again on its timer);
--   - an ACL user denied another command: the README's ACL rule names every command.
--   - the operation key (KEYS[5]) of another type: once_done() reads it (GET) before
--     the body's first write; once_record() writes it last, with SET, which takes a
--     key of any type and cannot fail after another write (out of memory refuses only
--     a script's first write).
--   - ZMSCORE in wake(), after the count was written: HB is a zset or absent
--     (fix_waiter_keys() ran first), and the command exists on every supported
--     server (Redis 6.2+, as the README says).
--   - a waiter key this script deleted (ZREM of its last member), read again: on a
--     Redis Cluster slot open for migration the node refuses a command on a key it
--     does not hold ("non local key"), one the script itself deleted too. A script
--     that changes the count names its operation key, which never exists before its
--     first run, so the node refuses that script before it runs (TRYAGAIN); the
--     cancel names none and runs, and wake() reads every waiter key before it removes
--     anything, and removes with one command per key, last.
-- Work per call is bounded: a wake-up pass looks at SCAN waiters (and drops the dead
-- among them), past at most 257 it drops anyway (256 dead, the leaving one); a purge
-- at 256.

local C, Q, HB, W = KEYS[1], KEYS[2], KEYS[3], KEYS[4]

local MAX = 4294967295
-- how many queued waiters one wake-up pass looks at (bounds the script's work)
local SCAN = 64
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local now_us = tonumber(t[1]) * 1000000 + tonumber(t[2])

-- Lua prints large round numbers as 1.7e+15, which Redis refuses.
local function int(x)
    return string.format('%d', x)
end

-- The count, or nil when unset. A key of another type fails in GET (WRONGTYPE); a
-- string that is not an integer is refused the same way.
local function count()
    local v = redis.call('GET', C)
    if v == false then return nil end
    -- integer text only, as INCRBY and DECRBY take it ('1e3', '0x10', ' 7' are not,
    -- nor a leading zero or '-0': '007', '00', '-0')
    local c = (v == '0' or string.find(v, '^%-?[1-9]%d*$')) and #v <= 11 and tonumber(v)
    if not c or c > MAX or c < -MAX then
        -- a string error (level 0: no position): Redis 6.2 cannot raise a table. The
        -- value is shown with its bytes outside printable ASCII escaped: an error line
        -- that is not UTF-8 cannot be parsed by the client, and leaves its connection
        -- unusable.
        local shown = string.gsub(string.sub(v, 1, 40), '[^%w%p ]', function(ch)
            return string.format('\\x%02x', string.byte(ch))
        end)
        error('WRONGTYPE the count of a counting semaphore must be an integer within 2^32, found ' .. shown, 0)
    end
    return c
end

-- An integer argument in lo..=MAX, or a string error (level 0: no position; Redis 6.2
-- cannot raise a table). Its one tonumber replaces the one the body did before: a
-- direct caller may send '1.5', 'nan' or 'inf', which tonumber accepts.
local function arg_int(v, lo, what)
    local x = tonumber(v)
    if not x or x ~= math.floor(x) or x < lo or x > MAX then
        error('invalid argument: ' .. what .. ' must be an integer in ' .. int(lo)
            .. '..=4294967295, found ' .. string.sub(tostring(v), 1, 40), 0)
    end
    return x
end

-- A waiter key of another type is deleted before anything else is written; the count
-- is read first, so a bad count fails the script before that write. Each body calls
-- it once its arguments are checked (a bad argument then fails before this DEL).
-- The keys it deleted are in `deleted`: wake() touches none of them again (see the
-- failure points).
local deleted = {}
local function fix_waiter_keys()
    local bad = {}
    for _, kt in ipairs({{Q, 'zset'}, {HB, 'zset'}, {W, 'hash'}}) do
        local ty = redis.call('TYPE', kt[1])['ok']
        if ty ~= 'none' and ty ~= kt[2] then bad[#bad + 1] = kt[1] end
    end
    if #bad > 0 then
        count()
        redis.call('DEL', unpack(bad))
        for _, k in ipairs(bad) do deleted[k] = true end
    end
end

-- C1: refuses a change that would take the count out of range.
local function check_range(c, delta)
    if c + delta > MAX or c + delta < -MAX then
        error('RANGE ' .. int(c) .. ' + ' .. int(delta) .. ' is outside -4294967295..=4294967295', 0)
    end
end

-- C3: takes waiter `id` out of the three waiter keys.
local function leave(id)
    redis.call('ZREM', Q, id)
    redis.call('ZREM', HB, id)
    redis.call('HDEL', W, id)
end

-- C6: drops waiters whose heartbeat has passed (their process died or stalled; a
-- stalled one puts itself back at its next look).
local function purge()
    local dead = redis.call('ZRANGEBYSCORE', HB, '-inf', now, 'LIMIT', 0, 256)
    if #dead > 0 then
        redis.call('ZREM', Q, unpack(dead))
        redis.call('ZREM', HB, unpack(dead))
        redis.call('HDEL', W, unpack(dead))
    end
end

-- C5: with `budget` permits free, tells the queued waiters to look again, in arrival
-- order, each one whose request still fits in what the earlier ones would take
-- (first fit: a large request at the head does not hold back smaller ones behind it;
-- the semaphore is not fair), and takes waiter `leaving` (if any: the cancel's) out of
-- the queue whatever the budget. Returns how many were told.
-- The dead waiters are dropped (the 256 whose heartbeats passed first, as purge()
-- takes them), and more dead ones may still stand at the head of the queue: each
-- waiter looked at is checked against its own heartbeat, and a dead one is dropped
-- here instead of being told (a message to a dead waiter would use up the budget of
-- a live one behind it, which would then wait for its re-check timer).
-- Reads first, removals last, one command per waiter key: ZREM of a key's last member
-- deletes the key, and on a Redis Cluster slot open for migration the node refuses a
-- command on a key it does not hold ("non local key"), one this script deleted too.
-- The cancel, which carries no operation key, runs on such a node while its keys are
-- still there; it used to read a waiter key its own removals had deleted, and fail
-- after them.
local function wake(budget, leaving)
    local told, gone, skip = 0, {}, {}
    if leaving then
        gone[1] = leaving
        skip[leaving] = true
    end
    if budget > 0 then
        local dead = {}
        if not deleted[HB] then
            dead = redis.call('ZRANGEBYSCORE', HB, '-inf', now, 'LIMIT', 0, 256)
        end
        for _, d in ipairs(dead) do
            if not skip[d] then
                skip[d] = true
                gone[#gone + 1] = d
            end
        end
        -- the first SCAN queued that are neither dead nor leaving
        local ids, queued = {}, {}
        if not deleted[Q] then queued = redis.call('ZRANGE', Q, 0, SCAN + #gone - 1) end
        for _, q in ipairs(queued) do
            if not skip[q] and #ids < SCAN then ids[#ids + 1] = q end
        end
        if #ids > 0 then
            local recs, beats = {}, {}
            if not deleted[W] then recs = redis.call('HMGET', W, unpack(ids)) end
            if not deleted[HB] then beats = redis.call('ZMSCORE', HB, unpack(ids)) end
            for k = 1, #ids do
                local rec = recs[k]
                if not beats[k] or tonumber(beats[k]) <= now then
                    gone[#gone + 1] = ids[k]
                elseif rec and budget > 0 then
                    local n, chan = string.match(rec, '^(%d+)|(.*)$')
                    n = tonumber(n)
                    if n and n <= budget and chan ~= '' then
                        redis.pcall('PUBLISH', chan, 'L ' .. ids[k])
                        budget = budget - n
                        told = told + 1
                    end
                end
            end
        end
    end
    if #gone > 0 then
        for _, k in ipairs({Q, HB}) do
            if not deleted[k] then redis.call('ZREM', k, unpack(gone)) end
        end
        if not deleted[W] then redis.call('HDEL', W, unpack(gone)) end
    end
    return told
end

