-- inspect: read the state of a semaphore, after purging expired holders and waiters.
--
-- ARGV: 1 caller's limit, 2 what: 'count' or 'holders'
-- Reply: {limit, used, queued}                                   for 'count'
--        {limit, used, queued, now, id, record, deadline, ...}   for 'holders'
--
-- Keeps: changes nothing but the purge and the serving of the queue it allows (K2,
-- K3, K4, K6); a semaphore with no keys is reported empty and no key is created.

local st = load()
purge(st)
if st.qn > 0 then serve(st) end
if st.exists then save(st) end
local limit = st.limit or tonumber(ARGV[1])
if ARGV[2] ~= 'holders' then return {limit, st.used, st.qn} end
local out = {limit, st.used, st.qn, now}
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
