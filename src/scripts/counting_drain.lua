-- counting drain: take every free permit at once and set the count to 0
-- (java.util.concurrent.Semaphore.drainPermits: a negative count, a debt, is
-- cleared to 0 too, and 0 permits are taken).
--
-- ARGV: 1 operation key's deadline or retention (once.lua; with KEYS[5] only)
-- Reply: the permits taken (0 for an unset semaphore, which stays unset); a resent
-- call: its first run's (C7)
--
-- Keeps: C2 (what it takes is exactly what was free); C4 (KEEPTTL: the value changes,
-- nothing else).

local done, bad_once = once_done(4, now)
if bad_once then return bad_once end
if done then return tonumber(done) end
fix_waiter_keys()
local c = count()
if c == nil or c == 0 then return 0 end
redis.call('SET', C, 0, 'KEEPTTL')
local taken = c
if c < 0 then taken = 0 end
once_record(4, int(taken))
return taken
