-- batch: several try-acquires and releases of one semaphore, sent together by the
-- threads of one client that wanted them at the same time (see combine.rs).
--
-- ARGV: a sequence of operations, each a tag followed by its arguments:
--   'a' and acquire.lua's 11 arguments     an acquire (the client sends only tries,
--                                          mode 't', so a batch never queues anyone;
--                                          without acquire.lua's optional 12th, the
--                                          ticket, which only a queued look has)
--   'A', id, cutoff                        an acquire with the other arguments of the
--                                          last 'a' before it (the tries of one
--                                          semaphore handle share them)
--   'r' and release.lua's argument (id)    a release
-- Reply: one entry per operation, in order: op_acquire's or op_release's reply (an
-- acquire on the fast path in one of op_acquire's short forms, fast_acquire.lua).
-- Errors: an unknown tag, a bad id or a bad number anywhere in the batch, found by the
-- first pass, before anything is written; a key of another type, WRONGTYPE from the
-- full logic's check_keys (common.lua), which cannot fail after the fast operations'
-- writes (see there). At most 64 operations, whose acquires ask
-- for at most MAX_LIMIT permits in all (the client's batches keep to both).
--
-- Keeps: everything op_acquire and op_release keep, after each operation, because the
-- operations run one after the other exactly as separate calls would at the same
-- instant: the plain ones on the fast path (batch_entry.lua), each writing at once but
-- for the 'used' of releases, written once before the full logic reads the hash; the
-- rest share one state, loaded once (after the fast ones wrote) with every record they
-- will need and written once at the end, and read it through their predecessors'
-- pending writes.
-- A batch sent twice (a resent command) is as safe as each of its operations sent
-- twice.

-- batch_entry.lua ran the plain operations before operation bat_next (their replies
-- are in `out`) and wrote what they left pending; the full logic runs the rest, in
-- order, its state loaded after the fast operations wrote theirs.

-- Operation i (from bat_next on): its id at ARGV[bat_id[i]]; for an acquire, its
-- other arguments at ARGV[bat_par[i]] on, bat_n[i] its permits and bat_cut[i] its
-- cutoff; bat_par[i] is false for a release. (Walked from the first operation: an
-- 'A' takes the arguments of the last 'a' before it, wherever that is.)
local bat_id, bat_par, bat_n, bat_cut = {}, {}, {}, {}
do
    local k, j, n = 1, 0, 0
    for i = 1, bat_count do
        local tag = ARGV[k]
        bat_id[i] = k + 1
        if tag == 'r' then
            bat_par[i], bat_n[i], bat_cut[i] = false, 0, 0
            k = k + 2
        elseif tag == 'a' then
            j, n = k + 2, tonumber(ARGV[k + 2])
            bat_par[i], bat_n[i], bat_cut[i] = j, n, tonumber(ARGV[k + 11]) or 0
            k = k + 12
        else
            bat_par[i], bat_n[i], bat_cut[i] = j, n, tonumber(ARGV[k + 2]) or 0
            k = k + 3
        end
    end
end

local ids = {}
for i = bat_next, bat_count do ids[#ids + 1] = ARGV[bat_id[i]] end
begin_batch(ids)
while bat_next <= bat_count do
    local j, id = bat_par[bat_next], ARGV[bat_id[bat_next]]
    if j then
        out[bat_next] = op_acquire(id, bat_n[bat_next], ARGV[j + 1], tonumber(ARGV[j + 2]),
            tonumber(ARGV[j + 3]), tonumber(ARGV[j + 4]), ARGV[j + 5], ARGV[j + 6],
            ARGV[j + 7] == '1', ARGV[j + 8], bat_cut[bat_next])
    else
        out[bat_next] = op_release(id)
    end
    bat_next = bat_next + 1
end
save(batch, true)
return out
