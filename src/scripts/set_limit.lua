-- set_limit: store ARGV[1] as the limit every client of the semaphore uses.
--
-- ARGV: 1 new limit, 2 retention ms
-- Reply: the previous stored limit, or -1 when none was stored
-- Errors: a limit that is no integer from 1 to MAX_LIMIT, or a retention that is no
-- integer from 1 to MAX_MS, or a key of another type (WRONGTYPE from load(), see
-- check_keys in common.lua), before anything is written. (A retention of 0 would set
-- the keys' expiry to now, which deletes them at once, and the hash written after it
-- would have no TTL.)
--
-- Keeps: K1 (the keys are created with a TTL, and kept for at least the retention
-- so that the stored limit outlives idle moments); holders above a lowered limit
-- keep their permits, and no grant is made until used + n fits the new limit (K5);
-- a raised limit serves the queue at once, up to MAX_SERVE waiters, the rest from the
-- next calls (K6, K9).

local new_limit, retention = int_arg(ARGV[1], 1, MAX_LIMIT), int_arg(ARGV[2], 1, MAX_MS)
if not new_limit or not retention then
    return refuse('bad limit')
end
local st = load()
local previous = st.limit or -1
init(st)
st.limit = new_limit
st.moved = true
-- (kept for the retention from every later extension of the keys' expiry too: extend)
put(st, 'lk', int(retention))
extend(st, now + retention, 0)
purge(st)
serve(st)
put(st, 'limit', int(new_limit))
save(st)
return previous
