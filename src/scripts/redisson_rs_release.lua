-- Redisson RSemaphore.release(n) (RedissonSemaphore.java 450-468) and
-- releaseIfExists(n) (476-499).
-- KEYS: 1 NAME (the counter), 2 redisson_sc:{NAME} (the channel)
-- ARGV: 1 publish command (redisson_publish.lua), 2 n (>= 1), 3 '1' for releaseIfExists
-- ARGV 4, KEYS 3: the operation key's deadline or retention and the key (every call of
-- this library, see once.lua).
-- Reply: {1, counter after} released (the new value was published; a resent call:
--        its first run's reply);
--        {0, 0} releaseIfExists on a missing counter: nothing changed.
-- No owner check and no upper bound, by design (Redisson #5066).
-- Errors (Redis does not undo a script's writes): n that is no integer from 1, of at
-- most 10 digits, is refused first (a negative or zero one took permits or published
-- for nothing, and one past 15 digits created a counter no later call can read); the
-- INCRBY is the only write, and a counter of another type, or not an integer, makes it
-- fail with nothing written; the publish after it is sent with redis.pcall and its error ignored (a
-- refused PUBLISH/SPUBLISH: waiters also poll).
if not string.find(ARGV[2], '^[1-9]%d*$') or #ARGV[2] > 10 then
    return redis.error_reply('ERR permits must be an integer from 1, found ' .. string.sub(ARGV[2], 1, 40))
end
local done, bad = once_done(2)
if bad then return bad end
if done then return {1, tonumber(done)} end
if ARGV[3] == '1' and redis.call('EXISTS', KEYS[1]) == 0 then
    return {0, 0}
end
-- (a counter that is no integer is refused with the error the other scripts give,
-- naming the key; any other refusal of the INCRBY, the first write, is its own error:
-- READONLY, OOM...; either way nothing was written)
local value, bad = incr(ARGV[2])
if bad then return bad end
publish(KEYS[2], value)
once_record(2, string.format("%d", value))
return {1, value}
