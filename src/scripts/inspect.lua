-- inspect: read the state of a semaphore, after purging expired holders and waiters.
--
-- ARGV: 1 caller's limit, 2 what: 'count' or 'holders'
-- Reply: {limit, used, queued, stored, client, exists, other}   for 'count'
--        the same, then {now, id, record, deadline, ...}          for 'holders'
--        (used: the permits of live holders, queued: the live waiters, see below;
--        stored: the limit set_limit stored, client: the limit the last acquiring
--        client passed, other: another limit a client passed since the keys were
--        made (clients disagree), -1 when absent; exists: 1 when the semaphore has
--        keys)
-- Errors: a key of another type, WRONGTYPE from load() (check_keys in common.lua),
-- before anything is written; none after load() (what follows the purge and the save
-- only reads h and the hash, whose types check_keys proved, and h keeps its sentinel);
-- 'holders' lists at most 10,000 holders (the most a semaphore can have, K9) and reads
-- waiters' members only to skip them, 1000 at a time.
--
-- Only live entries are reported: a holder or waiter whose deadline has passed but
-- that the purge's budget (MAX_PURGE, K9) left in h holds nothing and waits for
-- nothing (the next calls purge it, before they grant), so its permits are not
-- counted in `used`, it is not counted in `queued`, and it is not listed. They are
-- found by reading the ended part of h, 1000 members at a time (at most 200 pages, as
-- the listing), only when the purge left some ('mind' not ahead of now).
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
-- (entries left ended by the purge's budget: 'mind' is exact after a purge, K3)
local ended_permits, ended_waiters = 0, 0
if st.exists and now >= st.mind then
    local from = 0
    while from < 200000 do
        local page = redis.call('ZRANGEBYSCORE', H, '-inf', int(now), 'LIMIT', from, 1000)
        if #page == 0 then break end
        from = from + 1000
        local recs = redis.call('HMGET', I, unpack(page))
        for k = 1, #page do
            if recs[k] then
                if string.sub(page[k], 1, 2) == 'w:' then
                    ended_waiters = ended_waiters + 1
                else
                    ended_permits = ended_permits
                        + (tonumber(string.match(recs[k], '^(%d+)|')) or 0)
                end
            end
        end
    end
end
local limit = st.limit or tonumber(ARGV[1])
local out = {limit, math.max(st.used - ended_permits, 0), math.max(st.qn - ended_waiters, 0),
    st.limit or -1, client_limit, st.exists and 1 or 0, other_limit}
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
        -- (a holder whose lease has ended is not listed: see above)
        if member ~= '~' and string.sub(member, 1, 2) ~= 'w:' and tonumber(page[k + 1]) > now then
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
