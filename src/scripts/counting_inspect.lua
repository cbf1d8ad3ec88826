-- counting inspect: read the count and the number of live waiters. Writes nothing.
--
-- Reply: {set, count, queued}   set 1 when the count key exists (count 0 when not);
--                               queued: waiters whose heartbeat is still live
--
-- Keeps: every invariant, by changing nothing.

fix_waiter_keys()
local c = count()
local queued = redis.call('ZCOUNT', HB, '(' .. int(now), '+inf')
if c == nil then return {0, 0, queued} end
return {1, c, queued}
