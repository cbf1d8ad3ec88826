-- refresh: renew the leases of the permit ids (and waiter heartbeats 'w:'..id)
-- ARGV[3..] to now + ARGV[1] ms.
--
-- ARGV: 1 lease ms, 2 pad ms, 3.. ids (at most 1000; the client sends more in
--       several calls)
-- Reply: {-1}               the semaphore's keys are gone (server reset or flush)
--        {0, lost_id...}    the ids that are no longer there; every other one renewed
-- Errors: a bad lease or more than 1000 ids, before anything is written; a key of
-- another type: WRONGTYPE from load() (check_keys, common.lua), before that too. An argument
-- that is neither a permit id nor 'w:' and a permit id is reported lost, never renewed
-- (so the sentinel '~' keeps its score).
--
-- Keeps: an id that is not there (released, force-released, expired, served) is never
-- brought back (ZADD XX only touches members that exist, and an entry whose deadline
-- has passed is reported lost, not renewed, even when the purge's budget left it), so
-- a refresh racing a release cannot resurrect a permit; what the purge
-- frees goes to the queue (K6); K1 for the new deadlines.
-- A renewal never moves a deadline earlier (ZADD GT): a permit handed over
-- (into_parts) and adopted by a handle with a longer lease may still meet a renewal
-- its first holder sent before the hand-over, and that must not end the lease the
-- adopter counts on. Each client counts its permit's validity from its own call's
-- time and its own lease, so a deadline kept later on the server is safe for all.
-- (Only an adoption sets a deadline earlier than before, adopt.lua.)

local lease, pad = int_arg(ARGV[1], 1, MAX_MS), int_arg(ARGV[2], 0, MAX_MS)
if not lease or not pad then return refuse('bad lease') end
if #ARGV > 1002 then return refuse('refresh: more than 1000 ids') end
local st = load()
if not st.exists then return {-1} end
purge(st)
if st.qn > 0 then serve(st) end
local deadline = now + lease
local d = int(deadline)
local lost = {0}
local renewed = false
local CHUNK = 500
for first = 3, #ARGV, CHUNK do
    local ids = {}
    for k = first, math.min(first + CHUNK - 1, #ARGV) do
        local id = ARGV[k]
        if valid_id(id) or (string.sub(id, 1, 2) == 'w:' and valid_id(string.sub(id, 3))) then
            ids[#ids + 1] = id
        else
            lost[#lost + 1] = id
        end
    end
    if #ids > 0 then
        local scores = redis.call('ZMSCORE', H, unpack(ids))
        local args = {}
        for k = 1, #ids do
            -- (an entry whose deadline has passed is ended, also when the purge's
            -- budget, K9, left it in h: never renewed)
            if scores[k] and tonumber(scores[k]) > now then
                args[#args + 1] = d
                args[#args + 1] = ids[k]
            else
                lost[#lost + 1] = ids[k]
            end
        end
        if #args > 0 then
            redis.call('ZADD', H, 'XX', 'GT', unpack(args))
            renewed = true
        end
    end
end
-- (deadline_set keeps K3 and K1 with the renewal's deadline: one a GT kept later was
-- already covered by both. A refresh that renewed nothing wrote no deadline, and
-- leaves 'exp' as it was: moved on, it kept the keys a lease past the last use, K1)
if renewed then deadline_set(st, deadline, pad) end
save(st)
return lost
