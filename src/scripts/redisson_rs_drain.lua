-- Redisson RSemaphore.drainPermits() (RedissonSemaphore.java 507-516).
-- KEYS: 1 NAME (the counter), 2 the operation key (Redis Cluster, see
-- once.lua; ARGV 1 its retention)
-- Reply: the counter before (0 when missing; then nothing is written; a resent call:
-- its first run's). The counter becomes 0. No publish.
-- Errors (Redis does not undo a script's writes): a counter of another type fails the
-- GET; one that is not a number is a WRONGTYPE error reply; both before the SET, the
-- only write.
local done, bad = once_done(1)
if bad then return bad end
if done then return tonumber(done) end
local value = redis.call('GET', KEYS[1])
if value == false then
    return 0
end
local before = tonumber(value)
if before == nil then
    -- the value shown with its bytes outside printable ASCII escaped: an error line
    -- that is not UTF-8 cannot be parsed by the client and leaves its connection
    -- unusable
    local shown = string.gsub(string.sub(value, 1, 40), '[^%w%p ]', function(ch)
        return string.format('\\x%02x', string.byte(ch))
    end)
    return redis.error_reply('WRONGTYPE the counter of a Redisson semaphore must be an integer, found '
        .. shown)
end
redis.call('SET', KEYS[1], 0)
once_record(1, value)
return before
