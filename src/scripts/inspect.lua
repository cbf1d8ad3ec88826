-- inspect: read the state of a semaphore, after purging expired holders and waiters.
--
-- ARGV: 1 caller's limit, 2 what: 'count' or 'holders'
-- Reply: {limit, used, queued, stored, client, exists}        for 'count'
--        the same, then {now, id, record, deadline, ...}       for 'holders'
--        (stored: the limit set_limit stored, client: the limit the last acquiring
--        client passed, -1 when absent; exists: 1 when the semaphore has keys)
--
-- Keeps: changes nothing but the purge and the serving of the queue it allows (K2,
-- K3, K4, K6); a semaphore with no keys is reported empty and no key is created.

local st = load()
local client_limit = tonumber(redis.call('HGET', I, 'cl') or '-1')
purge(st)
if st.qn > 0 then serve(st) end
if st.exists then save(st) end
local limit = st.limit or tonumber(ARGV[1])
local out = {limit, st.used, st.qn, st.limit or -1, client_limit, st.exists and 1 or 0}
if ARGV[2] ~= 'holders' then return out end
out[#out + 1] = now
if not st.exists then return out end
local all = redis.call('ZRANGE', H, 0, -1, 'WITHSCORES')
for k = 1, #all, 2 do
    local member = all[k]
    if member ~= '~' and string.sub(member, 1, 2) ~= 'w:' then
        local rec = redis.call('HGET', I, member)
        if rec then
            out[#out + 1] = member
            out[#out + 1] = rec
            out[#out + 1] = tonumber(all[k + 1])
        end
    end
end
return out
