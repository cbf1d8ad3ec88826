-- Once, for the scripts that change a count without an owner to check (the counting
-- semaphore's, the Redisson layouts'), prepended to them. A call may be sent more than
-- once: on Redis Cluster the cluster client resends a command whose reply is late (it
-- may have run), and on every deployment the client sends a counting or `RSemaphore`
-- call whose connection broke (closed while idle, reset after the call ran) again on
-- another. Each such call of this library (every counting and `RSemaphore` call that
-- may change the count; a Redisson expirable semaphore's on a cluster, its calls
-- being safe to repeat by their ids elsewhere) names an operation key of its own
-- after the layout's keys (made by the
-- client, in the layout's hash slot), and as the script's last argument '@' and a
-- server time D (ms, the node's clock read by the client before the call's first send,
-- and two operation timeouts and ten seconds more). The run that changes the count
-- records its reply there (once_record, its last write: SET takes a key of any type)
-- and keeps the key until D and a second; a resent run finds it (once_done, before any
-- write) and answers that reply, changing nothing; a run after D that finds no key is
-- refused before any write. So a send held anywhere (a partition that heals, a paused
-- server, a socket buffer) for however long never finds the key gone and applies a
-- second time. A call this library sends again for minutes (a give-back owed to the
-- background thread) passes a D far enough on. Without the key (the Redisson
-- expirable semaphore's calls off a cluster; Redisson's own clients) both do nothing. The
-- older form, a retention in ms counted from the applying run, is still taken.
-- `base`: how many keys the script's layout has.
-- Errors: a retention that is no integer from 1 (or '@' and no integer from 1), and
-- a run after its D, are refused by once_done, and the key of another type fails its
-- GET, all before any write.

-- The server's time (ms) once_done read for a deadline, for once_record.
local once_now

-- The server's time (ms): `now_ms` when the script has read it already, else TIME.
local function once_clock(now_ms)
    if now_ms then return now_ms end
    local t = redis.call('TIME')
    return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end

-- The reply text a run of this same call recorded, nil when none, or an error reply
-- (nothing written) the caller returns. `now_ms`: the server's time when the script
-- has read it already (the counting scripts' prelude); else it is read here.
local function once_done(base, now_ms)
    local key = KEYS[base + 1]
    if not key then return nil end
    local r = ARGV[#ARGV]
    local at = string.match(r, '^@([1-9]%d*)$')
    if at then
        if #at > 15 then
            return nil, redis.error_reply('ERR the operation deadline must be server ms, found '
                .. string.sub(r, 1, 40))
        end
    elseif not string.find(r, '^[1-9]%d*$') or #r > 13 then
        return nil, redis.error_reply('ERR the operation key retention must be integer ms, found '
            .. string.sub(r, 1, 40))
    end
    local v = redis.call('GET', key)
    if v ~= false then return v end
    -- (a run after its deadline that finds the key still gets the recorded reply: the
    -- call was applied; one that finds none is refused)
    if at then
        once_now = once_clock(now_ms)
        if once_now > tonumber(at) then
            return nil, redis.error_reply('ERR redis-semaphore: the operation arrived after its '
                .. 'deadline (server ms ' .. at .. '); nothing changed')
        end
    end
    return nil
end

-- Records `text` as this call's reply (with an operation key). The key lives until
-- the deadline and a second: set with PX from the time once_done read (the same
-- instant as PXAT would give, and no command a server before Redis 6.2 lacks: the
-- record is the script's last write, and a command refused there would fail the
-- script after its writes).
local function once_record(base, text)
    local key = KEYS[base + 1]
    if not key then return end
    local at = string.match(ARGV[#ARGV], '^@(%d+)$')
    if at then
        once_now = once_now or once_clock()
        redis.call('SET', key, text, 'PX', string.format('%d',
            math.max(1, tonumber(at) + 1000 - once_now)))
    else
        redis.call('SET', key, text, 'PX', ARGV[#ARGV])
    end
end
