-- counting drain: take every free permit at once and set the count to 0
-- (java.util.concurrent.Semaphore.drainPermits: a negative count, a debt, is
-- cleared to 0 too, and 0 permits are taken).
--
-- Reply: the permits taken (0 for an unset semaphore, which stays unset)
--
-- Keeps: C2 (what it takes is exactly what was free); C4 (KEEPTTL: the value changes,
-- nothing else).

fix_waiter_keys()
local c = count()
if c == nil or c == 0 then return 0 end
redis.call('SET', C, 0, 'KEEPTTL')
if c < 0 then return 0 end
return c
