-- inspect: read the state of a semaphore, after purging expired holders.
--
-- ARGV: 1 caller's limit, 2 what: 'count' or 'holders'
-- Reply: {limit, used}                                   for 'count'
--        {limit, used, now, id, record, deadline, ...}   for 'holders'
--
-- Keeps: changes nothing but the purge of expired holders (K2, K3); a semaphore with
-- no keys is reported empty and no key is created.

local st = load()
purge(st)
if st.dirty then
    redis.call('HSET', I, 'used', st.used, 'mind', int(st.mind))
end
local limit = st.limit or tonumber(ARGV[1])
if ARGV[2] ~= 'holders' then return {limit, st.used} end
local out = {limit, st.used, now}
if not st.exists then return out end
local all = redis.call('ZRANGE', H, 0, -1, 'WITHSCORES')
for k = 1, #all, 2 do
    if all[k] ~= '~' then
        local rec = redis.call('HGET', I, all[k])
        if rec then
            out[#out + 1] = all[k]
            out[#out + 1] = rec
            out[#out + 1] = tonumber(all[k + 1])
        end
    end
end
return out
