-- counting try_set: set the count to ARGV[1] only when the semaphore is unset
-- (Redisson's trySetPermits: it initialises once and never resets).
--
-- ARGV: 1 n (>= 0)
-- Reply: 1 set, 0 already set (left unchanged)
--
-- Keeps: C1 (n <= MAX, checked by the caller and again here); C4 (the count key is
-- written without a TTL); C5 (waiters that queued on the unset semaphore are told).

local n = tonumber(ARGV[1])
if count() ~= nil then return 0 end
check_range(0, n)
redis.call('SET', C, ARGV[1])
wake(n)
return 1
