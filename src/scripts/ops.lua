-- The two operations of the hot path, as functions, so that one script call can run
-- one of them (acquire.lua, release.lua) or a batch of them (batch.lua). Each call
-- loads the state and saves it before it returns; in a batch the state is shared and
-- written once at the end, but every read goes through the pending writes, so a batch
-- is exactly the same operations run one after the other at the same instant `now`:
-- every invariant below holds after each operation, as seen by the next one.

-- acquire: grant n permits to permit id `id`, or queue it, or say when to look again.
--
-- Arguments: id, permits n, the caller's limit (text), lease ms, pad ms, heartbeat ms
--       (how long a queued waiter, and a permit pushed to it, lives without renewal),
--       origin "pid|host|label", mode ('t' try, never queued; 'w' wait, queued when
--       not granted), fair (boolean), the caller's wake-up channel, cutoff (server ms:
--       the caller has given up on this call by then, so it must not run; 0: none),
--       ticket (the arrival ticket this id's wait was given by an earlier queued
--       reply, an integer; 0 or nil: none; a batch passes none)
-- Reply: {1, now, token, deadline, slot...}  granted (or granted before to this same
--                                            id), lasting until `deadline` (server ms)
--        {0, now, retry_ms, is_head, ticket} queued: not now; retry_ms is when to look
--                                            again (-1: no time known; 0: at once, as
--                                            when 'mind' has passed because the
--                                            purge's budget ran out), is_head 1 when
--                                            the caller heads the queue, ticket its
--                                            arrival ticket (its score in q), which
--                                            its later looks pass back
--        {0, now, retry_ms, 0}               not now, a try (mode 't', never queued)
--        {-1, now, limit}                    n is above the limit: never grantable
--        {-2, now}                           past the cutoff: nothing was done
-- `now` is the server's time of the call, in ms, for the client's clock anchor.
--
-- Keeps: K5 (used + n <= limit before any grant, after expired holders are purged);
-- K6 (on a fair semaphore a caller goes first only when the queue is empty or it has
-- been served from its head); the same id is granted at most once while its lease
-- lives (a repeat returns the first grant with its own deadline, including one made by
-- serve while it waited); tokens strictly increase, also across the keys expiring (the
-- counter never falls below TIME in microseconds); slots are the lowest free ones and
-- all below the limit, because exactly `used` bits are set (K2) and used + n <= limit;
-- K1 for the new deadlines; a waiter is queued once, with a heartbeat; a waiter found
-- out of the queue (its heartbeat ended: a pause of the server, a slow client) queues
-- again with the ticket it passes when 1 <= ticket <= 'qseq' (given by this queue:
-- 'qseq' never falls while the hash lives), so it keeps its place in the arrival
-- order; 'qseq' then does not move, and a ticket above it (from a queue since deleted
-- with the keys and made again) or none gets a fresh one. A ticket only places the
-- caller in q: it is read after every decision of this call to grant or not, and
-- grants, limits, slots and tokens never read it (a caller on an empty queue is
-- granted or not the same with or without one; a later serve serves q's head, K6,
-- whatever its ticket); a call that
-- comes after its cutoff writes nothing, so a call whose reply the client stopped
-- waiting for cannot leave a grant behind that the client's clean-up has missed.
-- Fails only before its first write: a bad id is refused by the caller (acquire.lua,
-- batch.lua) before anything runs. One exception on Redis Cluster: a waiter's queueing
-- on a slot migrating away, after the call purged or served the queue's last waiter,
-- saves what the call did (whole operations) and answers TRYAGAIN, its caller neither
-- granted nor queued, so the call's repeat is the same call.

local function op_acquire(id, n, climit, lease, pad, hb, origin, mode, fair, chan, cutoff, ticket)
    if cutoff > 0 and now >= cutoff then return {-2, now} end
    local st = load(id)
    local limit = st.limit or tonumber(climit)
    -- (an earlier acquire of the same batch passed another limit: clients disagree,
    -- kept for operators as save() keeps one stored before)
    if st.climit and st.climit ~= climit then put(st, 'cdl', st.climit) end
    st.climit = climit

    if st.rec and live(st, id) then return grant_reply(st.rec, deadline_of(id)) end
    if n > limit then
        if st.wrec then
            dequeue(st, id)
            serve(st)
            save(st)
        end
        return {-1, now, limit}
    end

    purge(st)
    if st.qn > 0 then
        local served = serve(st, id)
        if served[id] then
            save(st)
            return served[id]
        end
    end

    local queued = st.wrec and st.qn > 0 and redis.call('ZSCORE', Q, id)
    if st.used + n <= limit and (st.qn == 0 or not fair) and not damaged then
        init(st)
        if queued then dequeue(st, id) end
        local reply = grant(st, id, n, now + lease, pad, origin)
        save(st)
        return reply
    end

    local retry = -1
    if st.mind < END_OF_TIME then retry = math.max(st.mind - now, 0) end
    if mode ~= 'w' then
        save(st)
        return {0, now, retry, 0}
    end

    init(st)
    local heartbeat = now + hb
    -- the first waiter makes q (K1: while nobody queues it does not exist, as
    -- check_keys or the ZREM of the last waiter left it)
    local q_made = false
    -- the caller's arrival ticket, its score in q (K8: an integer below 2^53)
    local seq
    if queued then
        redis.call('ZADD', H, 'XX', int(heartbeat), 'w:' .. id)
        seq = tonumber(queued)
    else
        q_made = st.qn == 0
        -- a ticket this queue gave the caller before keeps its place (see Keeps)
        local fresh = not (ticket and ticket >= 1 and ticket <= st.qseq)
        if fresh then
            st.qseq = st.qseq + 1
            seq = st.qseq
        else
            seq = ticket
        end
        if q_made then
            -- Making q can fail after this script wrote: on Redis Cluster, while the
            -- slot migrates away (SETSLOT .. MIGRATING), the node refuses any command
            -- on a key it does not hold ("non local key"), and q may be gone because
            -- this very call purged or served the last waiter (the script only runs
            -- there when all four keys existed). The caller's first write, so nothing
            -- of its own is written yet: save what the purge and serve did (whole
            -- operations, K1-K9 hold) and answer an error, TRYAGAIN for the migration
            -- (transient: the client looks again, the keys are then on one node)
            local made = redis.pcall('ZADD', Q, int(seq), id)
            if type(made) == 'table' and made.err then
                if fresh then st.qseq = st.qseq - 1 end
                save(st)
                if string.find(made.err, 'non local key', 1, true) then
                    return redis.error_reply('TRYAGAIN redis-semaphore: the semaphore\'s '
                        .. 'slot is migrating away from this node, which cannot make its '
                        .. 'queue key; the caller was not queued')
                end
                return redis.error_reply(made.err)
            end
        else
            redis.call('ZADD', Q, int(seq), id)
        end
        redis.call('ZADD', H, int(heartbeat), 'w:' .. id)
        put(st, 'w:' .. id, int(n) .. '|' .. int(limit) .. '|' .. int(lease) .. '|' .. int(pad) .. '|'
            .. int(hb) .. '|' .. chan .. '|' .. origin)
        st.qn = st.qn + 1
        st.dirty = true
    end
    local exp = st.exp
    deadline_set(st, heartbeat, pad)
    -- a new q takes the TTL of the others ('exp', at or after the heartbeat), unless
    -- deadline_set moved 'exp', which gave it to q too (qn > 0 by then)
    if q_made and st.exp == exp then redis.call('PEXPIREAT', Q, int(exp)) end
    save(st)
    -- The head looks again when the earliest deadline passes (a lease that ends without
    -- a release); the next few waiters when the head's heartbeat would end, so that a
    -- head whose process died is replaced within a heartbeat, not a lease. So does
    -- every waiter of an unfair caller: a release serves only the head, and a permit
    -- the head cannot use (it waits for more) is taken by the first unfair waiter
    -- that looks.
    local rank = redis.call('ZRANK', Q, id)
    if rank == 0 then
        if st.mind < END_OF_TIME then retry = math.max(st.mind - now, 0) end
        return {0, now, retry, 1, seq}
    end
    retry = -1
    if rank and (rank < 4 or not fair) then
        local head = redis.call('ZRANGE', Q, 0, 0)[1]
        local hdl = head and tonumber(redis.call('ZSCORE', H, 'w:' .. head))
        if hdl then retry = math.max(hdl - now, 0) end
    end
    return {0, now, retry, 0, seq}
end

-- release: give back the permits of permit id `id`, then serve the queue.
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

local function op_release(id)
    local st = load(id)
    if not st.rec then return 0 end
    local was_live = live(st, id)
    redis.call('ZREM', H, id)
    st.used = st.used - free_slots(st.rec)
    if st.used < 0 then st.used = 0 end
    del(st, id)
    st.dirty = true
    st.moved = true
    if st.qn > 0 then
        purge(st)
        serve(st)
    end
    save(st)
    if was_live then return 1 end
    return 2
end
