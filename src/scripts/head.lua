-- First part of every redis-semaphore script (before the fast path, if the script has
-- one, and before common.lua): the key names, the limits of one call's work, the
-- server's time read once (K7), and the two helpers the fast paths need. See
-- common.lua for the key layout and the invariants.

local H, I, S, Q = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
-- (every script takes the four keys; a direct caller that sends fewer is refused here,
-- before anything runs: a missing key would fail a command after a write)
if not Q then return redis.error_reply('ERR redis-semaphore: four keys expected (h, i, s, q)') end
local END_OF_TIME = 9000000000000000
local MAX_SERVE = 64
local MAX_PURGE = 512
-- The largest limit and permit count (the client's MAX_LIMIT), and the longest span
-- of milliseconds (lease, pad, heartbeat, retention: 300 years) an argument may give.
local MAX_LIMIT = 10000
local MAX_MS = 10000000000000
-- The largest fencing token ('ctr'): 2^53, below which every integer is exact. Tokens
-- are the server's time in microseconds or one above the last (about 1.8e15 today).
local MAX_TOKEN = 9007199254740992
local t = redis.call('TIME')
local t_s, t_us = tonumber(t[1]), tonumber(t[2])
local now = t_s * 1000 + math.floor(t_us / 1000)
local now_us = t_s * 1000000 + t_us

local function int(x)
    return string.format('%d', x)
end

-- `x` (an argument) as an integer from lo to hi, or nil: text that is no number, a
-- fraction, NaN, an infinity or a number out of range.
local function int_arg(x, lo, hi)
    local v = tonumber(x)
    if v and v == math.floor(v) and v >= lo and v <= hi then return v end
    return nil
end

-- Set once this script has met a holder record whose slots it could not free (see
-- slots_ok): 'used' and s may then disagree (K2), so no later operation of the script
-- grants (the lowest clear bit could lie past the limit); the next call's check_keys()
-- sees the disagreement and repairs.
local damaged = false

-- Whether a holder record's slot list (digits and commas, as its pattern matched it)
-- names only slots that SETBIT takes and that lie below MAX_LIMIT: no number of five
-- digits or more, none with a leading zero; and is no longer than the slots of its
-- permit count `p` (a number; at most MAX_LIMIT) can be written, at most four digits
-- and a comma each. A record edited by hand may hold others; it must not make a SETBIT
-- fail after a script's first write, nor make a script run one SETBIT per entry of a
-- list of any length (K9).
local function slots_ok(slots, p)
    return p <= MAX_LIMIT and #slots < 5 * p and not string.find(slots, '%d%d%d%d%d')
        and not string.find(',' .. slots, ',0%d')
end

-- Whether `id` has the shape of a permit id (see Namespaces in common.lua). (An
-- anchored pattern: measured about 3 µs cheaper per call than searching for a bad
-- character; the set written as ranges, the same as '[%x%-]' (Redis keeps the C
-- locale's character classes), matched a third faster than with the class '%x'.)
local function valid_id(id)
    return type(id) == 'string' and #id == 36 and string.find(id, '^[0-9a-f%-A-F]+$') ~= nil
end

