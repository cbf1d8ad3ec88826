-- batch: several try-acquires and releases of one semaphore, sent together by the
-- threads of one client that wanted them at the same time (see combine.rs).
--
-- ARGV: a sequence of operations, each a tag followed by its arguments:
--   'a' and acquire.lua's 9 arguments      an acquire (the client sends only tries,
--                                          mode 't', so a batch never queues anyone)
--   'r' and release.lua's argument (id)    a release
-- Reply: one entry per operation, in order: op_acquire's or op_release's reply.
--
-- Keeps: everything op_acquire and op_release keep, after each operation, because the
-- operations run one after the other exactly as separate calls would at the same
-- instant: they share one state, loaded once with every record they will need and
-- written once at the end, and read it through their predecessors' pending writes.
-- A batch sent twice (a resent command) is as safe as each of its operations sent
-- twice.

local ids = {}
local k = 1
while k <= #ARGV do
    ids[#ids + 1] = ARGV[k + 1]
    if ARGV[k] == 'a' then k = k + 10 else k = k + 2 end
end
begin_batch(ids)

local out = {}
k = 1
while k <= #ARGV do
    if ARGV[k] == 'a' then
        out[#out + 1] = op_acquire(ARGV[k + 1], tonumber(ARGV[k + 2]), ARGV[k + 3],
            tonumber(ARGV[k + 4]), tonumber(ARGV[k + 5]), ARGV[k + 6], ARGV[k + 7],
            ARGV[k + 8] == '1', ARGV[k + 9])
        k = k + 10
    elseif ARGV[k] == 'r' then
        out[#out + 1] = op_release(ARGV[k + 1])
        k = k + 2
    else
        return redis.error_reply('ERR redis-semaphore batch: unknown operation ' .. tostring(ARGV[k]))
    end
end
save(batch, true)
return out
