-- counting try_set: set the count to ARGV[1] only when the semaphore is unset
-- (Redisson's trySetPermits: it initialises once and never resets).
--
-- ARGV: 1 n (an integer in 0..=MAX), 2 operation key's deadline or retention (once.lua; with KEYS[5] only)
-- Reply: 1 set, 0 already set (left unchanged); a resent call: its first run's (C7)
--
-- Keeps: C1 (n is an integer <= MAX, checked by the caller and again here, before
-- any write: '1.5', 'nan' or 'inf' is refused; the count is stored as int(n), never
-- as sent); C4 (the count key is written without a TTL); C5 (waiters that queued on
-- the unset semaphore are told).

local n = arg_int(ARGV[1], 0, 'n')
local done, bad_once = once_done(4, now)
if bad_once then return bad_once end
if done then return tonumber(done) end
fix_waiter_keys()
if count() ~= nil then return 0 end
redis.call('SET', C, int(n))
wake(n)
once_record(4, '1')
return 1
