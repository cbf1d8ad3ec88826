-- adopt: a process takes over a permit that another handed over (Permit::into_parts):
-- the grant must still be held, live, with the token and slots the parts name; then
-- its lease is renewed as refresh.lua renews one, unless it was granted the adopter's
-- max_hold ago or more: then it is taken over as it is, not renewed (reply 2).
--
-- ARGV: 1 lease ms, 2 pad ms, 3 id, 4 token, 5 slots (both as the holder record
--       writes them: '17', '0,3'), 6 the adopter's max_hold ms (absent or '': none)
-- Reply: {1, held}  held and live: renewed to now + lease; `held` is how long ago (server
--              ms, at least 0) it was granted, from its record ({1} alone when the
--              record's grant time does not parse: edited by hand), so that the
--              adopter's max_hold counts from the grant, not from the adoption
--        {2, held, left}  held and live, but granted at least max_hold ago: taken over
--              as it is, not renewed (a permit is kept alive until max_hold after its
--              grant and no more, also when handed on); `left` is what is left of its
--              lease (server ms, at least 1)
--        {0}   not held: released, force-released, or ended and purged before
--        {-1}  the semaphore's keys are gone (every lease in it ended, or the
--              server's data was lost)
--        {-2}  held, but its lease has ended: not renewed (this call purges it)
--        {-3}  held, but with another token or other slots than the parts name:
--              not renewed
-- Errors: a bad lease, max_hold or id, or a key of another type (WRONGTYPE from load(), see
-- check_keys in common.lua), before anything is written (load() may repair partial
-- loss, after which nothing can fail).
--
-- Keeps: as refresh.lua: an id that is not held is never brought back, an ended lease
-- is purged (what it frees goes to the queue, K6), never renewed; K1 for the new
-- deadline, and K3 when it is earlier than the grant's: unlike a renewal, an adoption
-- sets the deadline to its own lease even when that is shorter (the permit then comes
-- back when the adopter's lease ends, should it die). That harms no valid holder:
-- the handle that gave the grant up (into_parts) no longer counts itself valid, and a
-- renewal it sent before that cannot move the deadline back (refresh.lua's GT).

local lease, pad = int_arg(ARGV[1], 1, MAX_MS), int_arg(ARGV[2], 0, MAX_MS)
if not lease or not pad then return refuse('bad lease') end
local max_hold = nil
if ARGV[6] and ARGV[6] ~= '' then
    max_hold = int_arg(ARGV[6], 1, MAX_MS)
    if not max_hold then return refuse('bad max_hold') end
end
local id = ARGV[3]
if not valid_id(id) then return refuse('not a permit id') end
local st = load(id)
if not st.exists then return {-1} end
local reply, held = 1, nil
if not st.rec then
    reply = 0
else
    local token, slots = string.match(st.rec, '^%d+|(%d+)|([%d,]*)|')
    -- (the grant time apart: a record whose time does not parse is still adopted)
    held = tonumber(string.match(st.rec, '^%d+|%d+|[%d,]*|(%d+)|'))
    if held then held = math.max(now - held, 0) end
    if token ~= ARGV[4] or slots ~= ARGV[5] then
        reply = -3
    elseif not live(st, id) then
        reply = -2
    end
end
local left = nil
if reply == 1 and max_hold and held and held >= max_hold then
    -- (live: its deadline is after now; a score edited by hand past the scripts'
    -- range of spans is answered as the longest span, which int() can write)
    reply, left = 2, math.min(math.max(deadline_of(id) - now, 1), MAX_MS)
end
purge(st)
if st.qn > 0 then serve(st) end
if reply == 1 then
    local deadline = now + lease
    redis.call('ZADD', H, 'XX', int(deadline), id)
    -- (this handle's lease may be shorter than the grant's: deadline_set keeps K3)
    deadline_set(st, deadline, pad)
end
save(st)
if reply == 2 then return {reply, int(held), int(left)} end
if reply == 1 and held then return {reply, int(held)} end
return {reply}
