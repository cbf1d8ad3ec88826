-- batch, first part: every operation checked (before anything is written), then the
-- plain ones run on the fast path (fast.lua) until the first that is not; when all
-- were plain the script returns here, before the full logic is even set up.
-- ARGV and reply as in batch.lua.

local count = 0
local k = 1
while k <= #ARGV do
    local tag = ARGV[k]
    if tag ~= 'a' and tag ~= 'r' then return redis.error_reply('ERR redis-semaphore: batch: unknown operation ' .. tostring(tag)) end
    if not valid_id(ARGV[k + 1]) then return redis.error_reply('ERR redis-semaphore: not a permit id') end
    if tag == 'a' and (tonumber(ARGV[k + 2]) or 0) < 1 then return redis.error_reply('ERR redis-semaphore: bad permit count') end
    count = count + 1
    if tag == 'a' then k = k + 12 else k = k + 2 end
end
if count > 64 then return redis.error_reply('ERR redis-semaphore: batch: more than 64 operations') end

-- The operations in order, each on the fast path (fast.lua) while it is plain; from
-- the first that is not, the rest go through the full logic (batch.lua).
local out = {}
k = 1
while k <= #ARGV do
    local reply
    if ARGV[k] == 'a' then
        reply = fast_acquire(ARGV[k + 1], tonumber(ARGV[k + 2]), ARGV[k + 3], tonumber(ARGV[k + 4]),
            tonumber(ARGV[k + 5]), ARGV[k + 8], ARGV[k + 7], tonumber(ARGV[k + 11]) or 0)
    else
        reply = fast_release(ARGV[k + 1], false)
    end
    if not reply then break end
    out[#out + 1] = reply
    if ARGV[k] == 'a' then k = k + 12 else k = k + 2 end
end
if k > #ARGV then return out end

