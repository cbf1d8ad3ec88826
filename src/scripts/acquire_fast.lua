-- acquire, first part: the arguments checked (before anything is written), then the
-- fast path (fast.lua); when it is not plain, the rest of the script (acquire.lua)
-- runs the full logic. ARGV as in acquire.lua.

local n = tonumber(ARGV[2])
if not valid_id(ARGV[1]) then return redis.error_reply('ERR redis-semaphore: not a permit id') end
if not n or n < 1 then return redis.error_reply('ERR redis-semaphore: bad permit count') end
do
    local reply = fast_acquire(ARGV[1], n, ARGV[3], tonumber(ARGV[4]), tonumber(ARGV[5]), ARGV[8],
        ARGV[7], tonumber(ARGV[11]) or 0)
    if reply then return reply end
end
