-- release, first part: the id checked (before anything is written), then the fast
-- path (fast_release.lua); when it is not plain, the rest of the script (release.lua) runs the
-- full logic. ARGV as in release.lua.

if not valid_id(ARGV[1]) then return redis.error_reply('ERR redis-semaphore: not a permit id') end
do
    local reply = fast_release(ARGV[1], ARGV[2] == '1')
    if reply then
        fast_flush()
        return reply
    end
end
