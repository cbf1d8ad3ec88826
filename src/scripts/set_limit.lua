-- set_limit: store ARGV[1] as the limit every client of the semaphore uses.
--
-- ARGV: 1 new limit, 2 retention ms
-- Reply: the previous stored limit, or -1 when none was stored
--
-- Keeps: K1 (the keys are created with a TTL, and kept for at least the retention
-- so that the stored limit outlives idle moments); holders above a lowered limit
-- keep their permits, and no grant is made until used + n fits the new limit (K5);
-- a raised limit serves the queue at once (K6).

local st = load()
local previous = st.limit or -1
init(st)
st.limit = tonumber(ARGV[1])
st.moved = true
extend(st, now + tonumber(ARGV[2]), 0)
purge(st)
serve(st)
put(st, 'limit', ARGV[1])
save(st)
return previous
