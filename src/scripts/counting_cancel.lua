-- counting cancel: waiter ARGV[1] gives up (timed out, or its acquire failed); it
-- leaves the queue, and what it may have been told about is passed on.
--
-- ARGV: 1 waiter id
-- Reply: 1
--
-- Keeps: C3 (no queue entry is left behind); C5 (if permits are free, the waiters
-- that fit are told now: the wake-up may have been meant for the one leaving).

leave(ARGV[1])
local c = count() or 0
wake(c)
return 1
