-- counting add: change the count by ARGV[1], which may be negative (add_permits with
-- a negative delta and reduce_permits). A negative count is a debt: acquires fail
-- until releases have paid it back.
--
-- ARGV: 1 delta (non-zero integer, |delta| <= MAX), 2 operation key's deadline or retention (once.lua)
--       (with KEYS[5] only)
-- Reply: the count after (a resent call: the count after its first run, C7)
--
-- Keeps: C1 (refused when the result would leave the range); C2 (an acquire never
-- succeeds while the count is <= 0: a debt only comes from here); C5 (a positive
-- delta tells the waiters that fit). An unset semaphore is created, as Redisson's
-- addPermits does. delta is checked, and written back by int(), before any write.

local delta = arg_int(ARGV[1], -MAX, 'delta')
if delta == 0 then error('invalid argument: delta must not be 0', 0) end
local done, bad_once = once_done(4, now)
if bad_once then return bad_once end
if done then return tonumber(done) end
fix_waiter_keys()
local c = count() or 0
check_range(c, delta)
local after = redis.call('INCRBY', C, int(delta))
if delta > 0 then wake(after) end
once_record(4, int(after))
return after
