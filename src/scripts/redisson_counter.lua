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
        .. ' of a Redisson semaphore must be an integer, found ' .. shown(value, 40)
end

-- The counter as a number, or false when the key is missing. A key of another type
-- fails its GET with WRONGTYPE; a string that is not integer text (as INCRBY takes it)
-- fails the script the same way, with a string error (level 0: no position; Redis 6.2
-- cannot raise a table). Every script calls it before its first write, or after a
-- write that proved the counter an integer (an INCRBY).
local function counter_value()
    local v = redis.call('GET', KEYS[1])
    if v == false then return false end
    local n = string.find(v, '^%-?%d+$') and #v <= 20 and tonumber(v)
    if not n then error(counter_refused(v), 0) end
    return n
end
