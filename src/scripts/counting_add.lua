-- counting add: change the count by ARGV[1], which may be negative (add_permits with
-- a negative delta and reduce_permits). A negative count is a debt: acquires fail
-- until releases have paid it back.
--
-- ARGV: 1 delta (non-zero integer, |delta| <= MAX)
-- Reply: the count after
--
-- Keeps: C1 (refused when the result would leave the range); C2 (an acquire never
-- succeeds while the count is <= 0: a debt only comes from here); C5 (a positive
-- delta tells the waiters that fit). An unset semaphore is created, as Redisson's
-- addPermits does.

local delta = tonumber(ARGV[1])
local c = count() or 0
check_range(c, delta)
local after = redis.call('INCRBY', C, ARGV[1])
if delta > 0 then wake(after) end
return after
