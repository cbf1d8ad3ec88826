-- release: give back the permits of permit id ARGV[1], then serve the queue.
--
-- Reply: 1 released while its lease was live
--        2 released, but its lease had already ended (nobody had taken it yet)
--        0 not held: unknown id, already released, or purged after its lease ended
--
-- Keeps: only the permits recorded for this id are freed, so running it twice (a
-- resent command) frees nothing the second time and never someone else's permit
-- (K2: the holder, its slot bits and its share of 'used' leave together); what is
-- freed goes to the head of the queue first (K6), in this same script, so the
-- hand-off costs the waiter no round trip.

local id = ARGV[1]
local st = load(id)
if not st.rec then return 0 end
local dl = tonumber(redis.call('ZSCORE', H, id))
redis.call('ZREM', H, id)
st.used = st.used - free_slots(st.rec)
if st.used < 0 then st.used = 0 end
st.del[#st.del + 1] = id
st.dirty = true
st.moved = true
if st.qn > 0 then
    purge(st)
    serve(st)
end
save(st)
if dl and dl > now then return 1 end
return 2
