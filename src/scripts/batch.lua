-- batch: several try-acquires and releases of one semaphore, sent together by the
-- threads of one client that wanted them at the same time (see combine.rs).
--
-- ARGV: a sequence of operations, each a tag followed by its arguments:
--   'a' and acquire.lua's 11 arguments     an acquire (the client sends only tries,
--                                          mode 't', so a batch never queues anyone)
--   'r' and release.lua's argument (id)    a release
-- Reply: one entry per operation, in order: op_acquire's or op_release's reply.
-- Errors: an unknown tag, a bad id or a bad number anywhere in the batch, found by the
-- first pass, before anything is written. At most 64 operations (the client's batches).
--
-- Keeps: everything op_acquire and op_release keep, after each operation, because the
-- operations run one after the other exactly as separate calls would at the same
-- instant: the plain ones on the fast path (batch_fast.lua), each writing at once; the
-- rest share one state, loaded once (after the fast ones wrote) with every record they
-- will need and written once at the end, and read it through their predecessors'
-- pending writes.
-- A batch sent twice (a resent command) is as safe as each of its operations sent
-- twice.

-- batch_fast.lua ran the plain operations up to position k of ARGV (their replies
-- are in `out`); the full logic runs the rest, in order, its state loaded after the
-- fast operations wrote theirs.

local ids = {}
local j = k
while j <= #ARGV do
    ids[#ids + 1] = ARGV[j + 1]
    if ARGV[j] == 'a' then j = j + 12 else j = j + 2 end
end
begin_batch(ids)
while k <= #ARGV do
    if ARGV[k] == 'a' then
        out[#out + 1] = op_acquire(ARGV[k + 1], tonumber(ARGV[k + 2]), ARGV[k + 3],
            tonumber(ARGV[k + 4]), tonumber(ARGV[k + 5]), tonumber(ARGV[k + 6]), ARGV[k + 7],
            ARGV[k + 8], ARGV[k + 9] == '1', ARGV[k + 10], tonumber(ARGV[k + 11]) or 0)
        k = k + 12
    else
        out[#out + 1] = op_release(ARGV[k + 1])
        k = k + 2
    end
end
save(batch, true)
return out
