-- inspect: read the state of a semaphore, after purging expired holders and waiters.
--
-- ARGV: 1 caller's limit, 2 what: 'count' or 'holders'
-- Reply: {limit, used, queued, stored, client, exists, other}   for 'count'
--        the same, then {now, id, record, deadline, ...}          for 'holders'
--        (stored: the limit set_limit stored, client: the limit the last acquiring
--        client passed, other: another limit a client passed since the keys were
--        made (clients disagree), -1 when absent; exists: 1 when the semaphore has
--        keys)
-- Errors: a key of another type, WRONGTYPE from load() (check_keys in common.lua),
-- before anything is written; none after load(); 'holders' lists at most 10,000 holders (the most a
-- semaphore can have, K9) and reads waiters' members only to skip them, 1000 at a time.
--
-- Keeps: changes nothing but the purge and the serving of the queue it allows (K2,
-- K3, K4, K6); a semaphore with no keys is reported empty and no key is created.

local st = load()
-- (text that is no limit, edited by hand, reads as absent: a nil would cut the reply)
local client_limit = int_arg(redis.call('HGET', I, 'cl'), 1, MAX_LIMIT) or -1
local other_limit = int_arg(redis.call('HGET', I, 'cdl'), 1, MAX_LIMIT) or -1
purge(st)
if st.qn > 0 then serve(st) end
if st.exists then save(st) end
local limit = st.limit or tonumber(ARGV[1])
local out = {limit, st.used, st.qn, st.limit or -1, client_limit, st.exists and 1 or 0,
    other_limit}
if ARGV[2] ~= 'holders' then return out end
out[#out + 1] = now
if not st.exists then return out end
local listed, from = 0, 0
while listed < 10000 and from < 200000 do
    local page = redis.call('ZRANGE', H, from, from + 999, 'WITHSCORES')
    if #page == 0 then break end
    from = from + 1000
    local ids = {}
    for k = 1, #page, 2 do
        local member = page[k]
        if member ~= '~' and string.sub(member, 1, 2) ~= 'w:' then
            ids[#ids + 1] = member
            ids[#ids + 1] = page[k + 1]
        end
    end
    if #ids > 0 then
        local names = {}
        for k = 1, #ids, 2 do names[#names + 1] = ids[k] end
        local recs = redis.call('HMGET', I, unpack(names))
        for k = 1, #names do
            if recs[k] then
                out[#out + 1] = names[k]
                out[#out + 1] = recs[k]
                out[#out + 1] = tonumber(ids[2 * k])
                listed = listed + 1
            end
        end
    end
end
return out
