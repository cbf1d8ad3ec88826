-- acquire: grant ARGV[2] permits to permit id ARGV[1], or say when to try again.
--
-- ARGV: 1 id, 2 permits n, 3 caller's limit, 4 lease ms, 5 pad ms, 6 "pid|host|label"
-- Reply: {1, token, slot...}      granted (or granted before to this same id)
--        {0, retry_after_ms}      not now; -1 when no holder's lease will end
--        {-1, limit}              n is above the limit: it can never be granted
--
-- Keeps: never over the limit (used + n <= limit before any grant, after expired
-- holders are purged); the same id is granted at most once while its lease lives
-- (a repeat returns the first grant); tokens strictly increase, also across the
-- keys expiring (the counter never falls below TIME in microseconds); slots are the
-- lowest free ones, and all of them are below the limit, because exactly `used`
-- bits are set (K2) and used + n <= limit; every key keeps a TTL past the new
-- deadline (K1).

local id, n, lease, pad = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[4]), tonumber(ARGV[5])
local st = load(id)
local limit = st.limit or tonumber(ARGV[3])

if st.rec then
    local dl = tonumber(redis.call('ZSCORE', H, id))
    if dl and dl > now then return grant_reply(st.rec) end
end
if n > limit then return {-1, limit} end

purge(st)
if st.used + n > limit then
    if st.dirty then
        redis.call('HSET', I, 'used', st.used, 'mind', int(st.mind))
    end
    if st.mind < END_OF_TIME then return {0, st.mind - now} end
    return {0, -1}
end

init(st)
local reply = {1, 0}
local slots = {}
for k = 1, n do
    local b = redis.call('BITPOS', S, 0)
    redis.call('SETBIT', S, b, 1)
    slots[k] = b
    reply[k + 2] = b
end
local token = math.max(st.ctr + 1, now_us)
reply[2] = token
local deadline = now + lease
redis.call('ZADD', H, int(deadline), id)
if deadline < st.mind then st.mind = deadline end
extend(st, deadline, pad)
local rec = n .. '|' .. int(token) .. '|' .. table.concat(slots, ',') .. '|' .. int(now) .. '|' .. ARGV[6]
redis.call('HSET', I, id, rec, 'used', st.used + n, 'ctr', int(token),
    'mind', int(st.mind), 'exp', int(st.exp))
return reply
