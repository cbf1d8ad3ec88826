-- refresh: renew the leases of the permit ids (and waiter heartbeats 'w:'..id)
-- ARGV[3..] to now + ARGV[1] ms.
--
-- ARGV: 1 lease ms, 2 pad ms, 3.. ids
-- Reply: {-1}               the semaphore's keys are gone (server reset or flush)
--        {0, lost_id...}    the ids that are no longer there; every other one renewed
--
-- Keeps: an id that is not there (released, force-released, expired, served) is never
-- brought back (ZADD XX only touches members that exist, after expired ones are
-- purged), so a refresh racing a release cannot resurrect a permit; what the purge
-- frees goes to the queue (K6); K1 for the new deadlines.

local lease, pad = tonumber(ARGV[1]), tonumber(ARGV[2])
local st = load()
if not st.exists then return {-1} end
purge(st)
if st.qn > 0 then serve(st) end
local deadline = now + lease
local d = int(deadline)
local lost = {0}
local CHUNK = 500
for first = 3, #ARGV, CHUNK do
    local ids = {}
    for k = first, math.min(first + CHUNK - 1, #ARGV) do ids[#ids + 1] = ARGV[k] end
    local scores = redis.call('ZMSCORE', H, unpack(ids))
    local args = {}
    for k = 1, #ids do
        if scores[k] then
            args[#args + 1] = d
            args[#args + 1] = ids[k]
        else
            lost[#lost + 1] = ids[k]
        end
    end
    if #args > 0 then redis.call('ZADD', H, 'XX', unpack(args)) end
end
extend(st, deadline, pad)
save(st)
return lost
