-- cancel: take waiter ARGV[1] out of the queue (its acquire timed out or was
-- cancelled).
--
-- Reply: {1, now, token, deadline, slot...}   too late: it had been granted, until
--                                             `deadline` (the caller decides to keep
--                                             or release the permit)
--        {0, now}                             removed from the queue, or not in it
-- Errors: an id that is not a permit id, or a key of another type (WRONGTYPE from
-- load(), see check_keys in common.lua), before anything is written.
--
-- Keeps: no queue entry is left behind (K4); the waiters behind it are served at once
-- if it was blocking them (K6).

local id = ARGV[1]
if not valid_id(id) then return refuse('not a permit id') end
local st = load(id)
if st.rec and live(st, id) then return grant_reply(st.rec, deadline_of(id)) end
if st.wrec then dequeue(st, id) end
purge(st)
serve(st)
save(st)
return {0, now}
