-- counting release (V): give back ARGV[1] permits, by anyone, and tell the waiters
-- they fit.
--
-- ARGV: 1 n (>= 1), 2 operation key's deadline or retention (once.lua; with KEYS[5] only)
-- Reply: the count after (a resent call: the count after its first run, C7)
--
-- Keeps: C1 (refused when it would pass MAX); C5 (the waiters whose requests fit
-- in the new count are told, in arrival order, in this same script). An unset
-- semaphore is created with count n, as Redisson's release does. Not idempotent, and
-- cannot be: there is no owner to check, so a release sent twice gives twice.
-- The library sends each call with an operation key (C7), so a call sent again
-- (after a broken connection; by the cluster client) gives once.
-- n is checked, and written back by int(), before any write.

local n = arg_int(ARGV[1], 1, 'n')
local done, bad_once = once_done(4, now)
if bad_once then return bad_once end
if done then return tonumber(done) end
fix_waiter_keys()
local c = count() or 0
check_range(c, n)
local after = redis.call('INCRBY', C, int(n))
wake(after)
once_record(4, int(after))
return after
