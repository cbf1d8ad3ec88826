-- acquire: grant ARGV[2] permits to permit id ARGV[1], or queue it, or say when to
-- look again.
--
-- ARGV: 1 id, 2 permits n, 3 caller's limit, 4 lease ms, 5 pad ms,
--       6 "pid|host|label", 7 mode ('t' try, never queued; 'w' wait, queued when not
--       granted), 8 fair ('1' or '0'), 9 the caller's wake-up channel
-- Reply: {1, token, slot...}          granted (or granted before to this same id)
--        {0, retry_ms, is_head}       not now; retry_ms is when the earliest lease
--                                     ends (-1: none), is_head 1 when the caller
--                                     heads the queue
--        {-1, limit}                  n is above the limit: it can never be granted
--
-- Keeps: K5 (used + n <= limit before any grant, after expired holders are purged);
-- K6 (on a fair semaphore a caller goes first only when the queue is empty or it has
-- been served from its head); the same id is granted at most once while its lease
-- lives (a repeat returns the first grant, including one made by serve while it
-- waited); tokens strictly increase, also across the keys expiring (the counter never
-- falls below TIME in microseconds); slots are the lowest free ones and all below the
-- limit, because exactly `used` bits are set (K2) and used + n <= limit; K1 for the
-- new deadlines; a waiter is queued once, with a heartbeat of one lease.

local id, n, lease, pad = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[4]), tonumber(ARGV[5])
local origin, mode, fair, chan = ARGV[6], ARGV[7], ARGV[8] == '1', ARGV[9]
local st = load(id)
local limit = st.limit or tonumber(ARGV[3])
st.climit = ARGV[3]

if st.rec then
    local dl = tonumber(redis.call('ZSCORE', H, id))
    if dl and dl > now then return grant_reply(st.rec) end
end
if n > limit then
    if st.wrec then
        dequeue(st, id)
        serve(st)
        save(st)
    end
    return {-1, limit}
end

purge(st)
if st.qn > 0 then
    local served = serve(st)
    if served[id] then
        save(st)
        return served[id]
    end
end

local queued = st.wrec and st.qn > 0 and redis.call('ZSCORE', Q, id)
if st.used + n <= limit and (st.qn == 0 or not fair) then
    init(st)
    if queued then dequeue(st, id) end
    local reply = grant(st, id, n, lease, pad, origin)
    save(st)
    return reply
end

local retry = -1
if st.mind < END_OF_TIME then retry = st.mind - now end
if mode ~= 'w' then
    save(st)
    return {0, retry, 0}
end

init(st)
local heartbeat = now + lease
if queued then
    redis.call('ZADD', H, 'XX', int(heartbeat), 'w:' .. id)
else
    st.qseq = st.qseq + 1
    redis.call('ZADD', Q, int(st.qseq), id)
    redis.call('ZADD', H, int(heartbeat), 'w:' .. id)
    st.put[#st.put + 1] = 'w:' .. id
    st.put[#st.put + 1] = n .. '|' .. int(limit) .. '|' .. int(lease) .. '|' .. int(pad) .. '|' .. chan .. '|' .. origin
    st.qn = st.qn + 1
    st.dirty = true
end
if heartbeat < st.mind then st.mind = heartbeat end
extend(st, heartbeat, pad)
save(st)
local head = redis.call('ZRANGE', Q, 0, 0)[1]
if st.mind < END_OF_TIME then retry = st.mind - now end
return {0, retry, head == id and 1 or 0}
