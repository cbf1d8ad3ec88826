-- acquire, first part: the arguments checked (before anything is written), then the
-- fast path (fast_acquire.lua); when it is not plain, the rest of the script (acquire.lua)
-- runs the full logic. ARGV as in acquire.lua. Errors: a bad id, a bad permit count, a
-- bad ticket (ARGV[12]), all before anything is written; the fast path checks the
-- other arguments it uses before it writes (fast_acquire.lua), and the full logic all
-- of them (acquire.lua).

-- (a comparison of text costs next to nothing, tonumber() of text about 2,000 instructions)
local n = 1
if ARGV[2] ~= '1' then n = int_arg(ARGV[2], 1, MAX_LIMIT) end
if not valid_id(ARGV[1]) then return redis.error_reply('ERR redis-semaphore: not a permit id') end
if not n then return redis.error_reply('ERR redis-semaphore: bad permit count') end
-- the arrival ticket (ARGV[12], sent only by a waiter's look that has one): checked
-- here, before the fast path may write, though only the full logic uses it
if ARGV[12] and not int_arg(ARGV[12], 0, MAX_TOKEN) then
    return redis.error_reply('ERR redis-semaphore: bad ticket')
end
do
    local reply = fast_acquire(ARGV[1], n, 2, tonumber(ARGV[11]) or 0)
    -- (a fast acquire leaves nothing pending: only a release does)
    if reply then return reply end
end
