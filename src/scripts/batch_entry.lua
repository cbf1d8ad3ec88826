-- batch, first part: every operation checked (before anything is written), then the
-- plain ones run on the fast path (fast_acquire.lua, fast_release.lua) until the first that is not; when all
-- were plain the script returns here, before the full logic is even set up.
-- ARGV and reply as in batch.lua.

-- Operation i: its id at ARGV[bat_id[i]]; for an acquire, its other arguments at
-- ARGV[bat_par[i]] on (those of an 'a', shared with the 'A's after it; see
-- fast_numbers), bat_n[i] its permits and bat_cut[i] its cutoff; bat_par[i] is false
-- for a release.
local bat_id, bat_par, bat_n, bat_cut = {}, {}, {}, {}
do
    local k, shared, shared_n = 1, nil, nil
    while k <= #ARGV do
        local tag = ARGV[k]
        if tag ~= 'a' and tag ~= 'r' and not (tag == 'A' and shared) then
            return redis.error_reply('ERR redis-semaphore: batch: unknown operation ' .. tostring(tag))
        end
        if not valid_id(ARGV[k + 1]) then return redis.error_reply('ERR redis-semaphore: not a permit id') end
        local i = #bat_id + 1
        if i > 64 then return redis.error_reply('ERR redis-semaphore: batch: more than 64 operations') end
        bat_id[i] = k + 1
        if tag == 'a' then
            local bad = check_acquire(k + 2)
            if bad then return redis.error_reply('ERR redis-semaphore: ' .. bad) end
            shared, shared_n = k + 2, tonumber(ARGV[k + 2])
            bat_par[i], bat_n[i], bat_cut[i] = shared, shared_n, tonumber(ARGV[k + 11]) or 0
            k = k + 12
        elseif tag == 'A' then
            bat_par[i], bat_n[i], bat_cut[i] = shared, shared_n, tonumber(ARGV[k + 2]) or 0
            k = k + 3
        else
            bat_par[i], bat_n[i], bat_cut[i] = false, 0, 0
            k = k + 2
        end
    end
end

-- The operations in order, each on the fast path while it is plain; from
-- the first that is not, the rest go through the full logic (batch.lua), after the
-- fast ones' pending write.
local out = {}
local bat_next = 1
while bat_next <= #bat_id do
    local reply
    if bat_par[bat_next] then
        reply = fast_acquire(ARGV[bat_id[bat_next]], bat_n[bat_next], bat_par[bat_next], bat_cut[bat_next])
    else
        reply = fast_release(ARGV[bat_id[bat_next]], false)
    end
    if not reply then break end
    out[bat_next] = reply
    bat_next = bat_next + 1
end
fast_flush()
if bat_next > #bat_id then return out end
