-- RPermitExpirableSemaphore setPermits(p) (PES 823-840) and addPermits(d) (862-873).
-- ARGV: 3 'set' | 'add', 4 p (set: >= 0) or d (add: signed, non-zero)
-- set: counter absent -> SET p, publish p; else total = counter + ZCOUNT 0 +inf, and
--      when total ~= p: INCRBY (p - total), publish p (the counter may go negative
--      when shrinking below the permits held).
-- add: counter (missing = 0) + d -> SET; publish d when d > 0.
-- ARGV 5, KEYS 4 (add only): the operation key's deadline or retention and the key (every
-- call of this library: a run sent again after its connection broke answers the first
-- run's reply, see once.lua).
-- Reply: the counter after (add, resent: its first run's).
-- Errors (see the prelude): p or d that is no integer text of at most 10 digits, as
-- counter_text() reads a counter, is refused first (not 'inf', not '1.5', nor '007'
-- or '-0': set stores p as sent, and a counter no later call can read would have been
-- stored); a counter
-- of another type, or one that is not integer text, fails counter_value() with
-- WRONGTYPE, a zset of another type the ZCOUNT, all before the one write (SET or INCRBY, which writes
-- nothing when refused); only the publish (pcall) follows it.
local arg = nil
if ARGV[4] and counter_text(ARGV[4]) and #ARGV[4] <= 11 then arg = tonumber(ARGV[4]) end
if arg == nil then
    return redis.error_reply('ERR permits must be a number, found ' .. string.sub(tostring(ARGV[4]), 1, 40))
end
if ARGV[3] == 'add' then
    local done, bad = once_done(3)
    if bad then return bad end
    if done then return tonumber(done) end
end
local value = counter_value()
if ARGV[3] == 'add' then
    local after = (value or 0) + arg
    if not counter_fits(after) then
        return redis.error_reply(counter_refused(redis.call('GET', KEYS[1])))
    end
    redis.call('SET', KEYS[1], string.format('%d', after))
    if arg > 0 then
        publish(KEYS[3], ARGV[4])
    end
    once_record(3, string.format('%d', after))
    return after
end
if value == false then
    redis.call('SET', KEYS[1], ARGV[4])
    publish(KEYS[3], ARGV[4])
    return arg
end
local total = value + redis.call('ZCOUNT', KEYS[2], 0, '+inf')
if total ~= arg then
    value = redis.call('INCRBY', KEYS[1], string.format('%d', arg - total))
    publish(KEYS[3], ARGV[4])
end
return tonumber(value)
