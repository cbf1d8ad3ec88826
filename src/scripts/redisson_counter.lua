-- Shared by the Redisson scripts (both layouts), after redisson_publish.lua: the
-- counter of free permits (KEYS[1], NAME itself, as in Redisson) read as a number.

-- The key's name and a stored value as an error line may show them: at most 40 bytes
-- (200 for a name), every byte outside printable ASCII escaped (an error line that is
-- not UTF-8 or holds a line break cannot be parsed by the client, and leaves its
-- connection unusable).
local function shown(text, most)
    return (string.gsub(string.sub(text, 1, most), '[^%w%p ]', function(ch)
        return string.format('\\x%02x', string.byte(ch))
    end))
end

-- The WRONGTYPE error of a counter whose value is `value`, not an integer: an error
-- reply to return, naming the key and the value.
local function counter_refused(value)
    return 'WRONGTYPE the counter ' .. shown(KEYS[1], 200)
        .. ' of a Redisson semaphore must be an integer of at most 15 digits, found '
        .. shown(value, 40)
end

-- Whether `v` is a counter's value: integer text as INCRBY and DECRBY take it (no
-- sign but '-', no leading zero, not '-0'), of at most 15 digits, so that it is exact
-- as a Lua number (Redisson's counts are Java ints: far below that).
local function counter_text(v)
    local digits = #v
    if string.sub(v, 1, 1) == '-' then digits = digits - 1 end
    return digits <= 15 and (v == '0' or string.find(v, '^%-?[1-9]%d*$') ~= nil)
end

-- The largest counter magnitude counter_text() takes (15 digits).
local COUNTER_MAX = 999999999999999

-- Whether a new counter value `v` (a Lua number) is one counter_text() takes.
local function counter_fits(v)
    return v <= COUNTER_MAX and v >= -COUNTER_MAX
end

-- The counter as a number, or false when the key is missing. A key of another type
-- fails its GET with WRONGTYPE; a string that is not counter_text() fails the script
-- the same way, with a string error (level 0: no position; Redis 6.2 cannot raise a
-- table). Every script calls it before its first write, or after a write that proved
-- the counter an integer (an INCRBY).
local function counter_value()
    local v = redis.call('GET', KEYS[1])
    if v == false then return false end
    if not counter_text(v) then error(counter_refused(v), 0) end
    return tonumber(v)
end

-- INCRBY n on the counter through redis.pcall: its new value, or nil and an error
-- reply (the INCRBY wrote nothing): the WRONGTYPE of counter_refused() when the
-- counter holds text that is no integer, else the INCRBY's own error (WRONGTYPE for
-- another type, READONLY on a replica, OOM, an overflow...). Called before any other
-- write of the script.
-- The counter is read and checked first (a value INCRBY takes but counter_text()
-- refuses, 16 to 19 digits, would otherwise be raised, and the script fail at its next
-- read of the counter, after this write), and a result past 15 digits is refused too.
local function incr(n)
    local stored = redis.pcall('GET', KEYS[1])
    if type(stored) == 'string' then
        if not counter_text(stored) then
            return nil, redis.error_reply(counter_refused(stored))
        end
        local after = tonumber(stored) + tonumber(n)
        if not counter_fits(after) then
            return nil, redis.error_reply(counter_refused(stored))
        end
    elseif stored == false and not counter_fits(tonumber(n)) then
        -- (a missing counter: INCRBY would create it with n itself)
        return nil, redis.error_reply(counter_refused(tostring(n)))
    end
    local value = redis.pcall('INCRBY', KEYS[1], n)
    if type(value) ~= 'table' then return value end
    return nil, value
end
