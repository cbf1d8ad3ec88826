-- counting cancel: waiter ARGV[1] gives up (timed out, or its acquire failed); it
-- leaves the queue, and what it may have been told about is passed on.
--
-- ARGV: 1 waiter id
-- Reply: 1
--
-- Keeps: C3 (no queue entry is left behind); C5 (if permits are free, the waiters
-- that fit are told now: the wake-up may have been meant for the one leaving).
-- The count is read before wake() writes, so a bad count key fails with the queue
-- untouched. wake() takes the waiter out with the dead ones, after its reads: this
-- script has no operation key, so it runs on a Redis Cluster node whose slot is open
-- for migration, which refuses a read of a waiter key the leaving waiter's removal
-- deleted (see counting_common.lua's failure points).

local id = ARGV[1]
if id == nil then error('invalid argument: cancel needs a waiter id', 0) end
fix_waiter_keys()
local c = count() or 0
wake(c, id)
return 1
