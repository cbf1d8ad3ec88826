-- batch, first part: every operation checked (before anything is written), then the
-- plain ones run on the fast path (fast_acquire.lua, fast_release.lua) until the first that is not; when all
-- were plain the script returns here, before the full logic is even set up.
-- ARGV and reply as in batch.lua.
--
-- Cost: the operations are walked in ARGV twice (checked, then run) rather than kept
-- in tables: building four tables of a batch's operations cost the server more than
-- walking the arguments again (measured with scripts/server-instructions.sh batch).

-- The first pass: what is wrong anywhere in the batch is refused before any write.
local bat_count = 0
do
    -- `asked`: the permits the batch's acquires ask for in all, at most MAX_LIMIT, so
    -- that one call sets at most MAX_LIMIT slot bits and clears only those and the
    -- ones set before it (K9), however its operations repeat ids
    local k, shared, n, asked = 1, false, 0, 0
    while k <= #ARGV do
        local tag = ARGV[k]
        if tag ~= 'a' and tag ~= 'r' and not (tag == 'A' and shared) then
            return redis.error_reply('ERR redis-semaphore: batch: unknown operation ' .. tostring(tag))
        end
        if not valid_id(ARGV[k + 1]) then return redis.error_reply('ERR redis-semaphore: not a permit id') end
        bat_count = bat_count + 1
        if bat_count > 64 then return redis.error_reply('ERR redis-semaphore: batch: more than 64 operations') end
        if tag == 'a' then
            local bad = check_acquire(k + 2)
            if bad then return redis.error_reply('ERR redis-semaphore: ' .. bad) end
            shared = true
            n = 1
            if ARGV[k + 2] ~= '1' then n = tonumber(ARGV[k + 2]) end
            asked = asked + n
            k = k + 12
        elseif tag == 'A' then
            asked = asked + n
            k = k + 3
        else
            k = k + 2
        end
    end
    if asked > MAX_LIMIT then
        return redis.error_reply('ERR redis-semaphore: batch: more than ' .. MAX_LIMIT .. ' permits asked')
    end
end

-- The operations in order, each on the fast path while it is plain; from the first
-- that is not (operation bat_next), the rest go through the full logic (batch.lua),
-- after the fast ones' pending write. An acquire's other arguments are at ARGV[j] on
-- (those of the last 'a', shared with the 'A's after it; see fast_numbers), `n` its
-- permits (checked above).
local out = {}
local bat_next = 1
do
    local k, j, n = 1, 0, 0
    while bat_next <= bat_count do
        local tag, reply = ARGV[k], nil
        if tag == 'r' then
            -- (an idle release that is not the batch's last operation keeps the
            -- keys: on a Redis Cluster slot that migrates away, no key the script
            -- deleted can be read or made again, so an operation after such a DEL
            -- would fail after this write)
            reply = fast_release(ARGV[k + 1], bat_next < bat_count)
            k = k + 2
        elseif tag == 'a' then
            j, n = k + 2, tonumber(ARGV[k + 2])
            reply = fast_acquire(ARGV[k + 1], n, j, tonumber(ARGV[k + 11]) or 0)
            k = k + 12
        else
            reply = fast_acquire(ARGV[k + 1], n, j, tonumber(ARGV[k + 2]) or 0)
            k = k + 3
        end
        if not reply then break end
        out[bat_next] = reply
        bat_next = bat_next + 1
    end
end
fast_flush()
if bat_next > bat_count then return out end
