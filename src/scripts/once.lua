-- Once, for the scripts that change a count without an owner to check (the counting
-- semaphore's, the Redisson layouts'), prepended to them. On Redis Cluster, whose
-- client resends a command whose reply is late (it may have run), each such call of
-- this library names an operation key of its own after the layout's keys (made by the
-- client, in the layout's hash slot), with its retention in ms as the script's last
-- argument. The run that changes the count records its reply there (once_record, its
-- last write: SET takes a key of any type), and a resent run finds it (once_done,
-- before any write) and answers that reply, changing nothing. Without the key (one
-- server, where nothing resends; Redisson's own clients) both do nothing. `base`: how
-- many keys the script's layout has.
-- Errors: a retention that is no integer from 1 is refused by once_done, and the key
-- of another type fails its GET, both before any write.

-- The reply text a run of this same call recorded, nil when none, or an error reply
-- (nothing written) the caller returns.
local function once_done(base)
    local key = KEYS[base + 1]
    if not key then return nil end
    local r = ARGV[#ARGV]
    if not string.find(r, '^[1-9]%d*$') or #r > 13 then
        return nil, redis.error_reply('ERR the operation key retention must be integer ms, found '
            .. string.sub(r, 1, 40))
    end
    local v = redis.call('GET', key)
    if v == false then return nil end
    return v
end

-- Records `text` as this call's reply (with an operation key).
local function once_record(base, text)
    local key = KEYS[base + 1]
    if key then redis.call('SET', key, text, 'PX', ARGV[#ARGV]) end
end
