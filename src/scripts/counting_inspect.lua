-- counting inspect: read the count and the number of live waiters. Writes nothing.
--
-- Reply: {set, count, queued}   set 1 when the count key exists (count 0 when not);
--                               queued: waiters whose heartbeat is still live
--
-- Keeps: every invariant, by changing nothing.

local c = count()
-- (a heartbeat key of another type counts no waiter: the next acquire or release
-- repairs it; this script writes nothing)
local queued = redis.pcall('ZCOUNT', HB, '(' .. int(now), '+inf')
if type(queued) ~= 'number' then queued = 0 end
if c == nil then return {0, 0, queued} end
return {1, c, queued}
