-- acquire, first part: the arguments checked (before anything is written), then the
-- fast path (fast_acquire.lua); when it is not plain, the rest of the script (acquire.lua)
-- runs the full logic. ARGV as in acquire.lua.

-- (a comparison of text costs next to nothing, tonumber() of text about 2,000 instructions)
local n = 1
if ARGV[2] ~= '1' then n = int_arg(ARGV[2], 1, MAX_LIMIT) end
if not valid_id(ARGV[1]) then return redis.error_reply('ERR redis-semaphore: not a permit id') end
if not n then return redis.error_reply('ERR redis-semaphore: bad permit count') end
do
    local reply = fast_acquire(ARGV[1], n, 2, tonumber(ARGV[11]) or 0)
    -- (a fast acquire leaves nothing pending: only a release does)
    if reply then return reply end
end
