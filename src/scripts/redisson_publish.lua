-- Prepended to every Redisson-layout script (redisson_rs_*.lua, redisson_try_set.lua,
-- redisson_pes_*.lua): how freed permits are announced on redisson_sc:{NAME}.
-- ARGV[1] names the command: 'PUBLISH', 'SPUBLISH' (Redisson's on a Redis 7 cluster,
-- where it subscribes with SSUBSCRIBE), or 'BOTH' (each of them: the library's
-- default on Redis Cluster, where waiters of either kind may listen; the two
-- namespaces do not see each other).
-- Errors: none. Each command is sent with redis.pcall and its error ignored (refused by
-- ACL, SPUBLISH unknown before Redis 7): waiters also look again on a timer. So a
-- publish may follow a script's writes.

local function publish(channel, value)
    local command = ARGV[1]
    if command == 'BOTH' then
        redis.pcall('SPUBLISH', channel, value)
        command = 'PUBLISH'
    end
    redis.pcall(command, channel, value)
end
