-- Prelude shared by every redis-semaphore script: the Rust side concatenates it in
-- front of each script body, so each EVALSHA is still one self-contained script.
--
-- Key layout of semaphore NAME (every key carries the hash tag {NAME}, so a script
-- touches a single hash slot and runs unchanged on Redis Cluster):
--
--   KEYS[1]  redsem:{NAME}:h  zset    permit id -> lease deadline (server ms), and
--                                      'w:'..waiter id -> heartbeat deadline of a waiter
--   KEYS[2]  redsem:{NAME}:i  hash    'used'  permits held by the holders in h
--                                      'ctr'   last fencing token granted
--                                      'limit' limit stored by set_limit (absent: the
--                                              caller's limit is used)
--                                      'lk'    how long (ms) a stored limit is kept
--                                              from each extension of 'exp' on
--                                      'exp'   expiry time (server ms) of the keys
--                                      'mind'  lower bound of the earliest deadline in h
--                                      'qn'    number of queued waiters
--                                      'qseq'  last arrival ticket of the queue
--                                              (never falls while the hash lives;
--                                              a waiter that queues again may
--                                              bring back one it was given, and
--                                              'qseq' then stays: op_acquire)
--                                      'cl'    the limit the last acquiring client
--                                              passed (shown to operators)
--                                      <id>    holder record, see below
--                                      'w:'..<id>  waiter record, see below
--   KEYS[3]  redsem:{NAME}:s  string  bitmap: bit k is 1 while slot k is occupied
--   KEYS[4]  redsem:{NAME}:q  zset    waiter id -> arrival ticket: the FIFO queue
--                                      (equal tickets, possible once the keys
--                                      were made again, go by id);
--                                      it exists only while someone queues ('qn' > 0):
--                                      the first waiter's ZADD makes it (and gives it
--                                      its TTL), and the ZREM of the last one deletes it
--                                      (Redis deletes an empty zset)
--
-- h also holds the member '~' scored END_OF_TIME, so it never empties and never loses
-- its TTL while the hash lives; it sorts after every real member.
--
-- Holder record: "permits|token|slot,slot,...|acquired_ms|pid|host|label".
-- Waiter record: "permits|limit|lease_ms|pad_ms|heartbeat_ms|channel|pid|host|label".
--
-- Namespaces. A permit id is 36 characters of hexadecimal digits and '-' (uuid text:
-- the client makes it); every script refuses any other id before its first write
-- (valid_id). So an id from outside can only name a holder: the state fields are short
-- words, waiter members and fields are 'w:' followed by an id (38 characters), and the
-- sentinel is '~'; none of them is 36 such characters.
--
-- Invariants every script keeps:
--   K1  h, i and s exist together and expire together at 'exp'; q exists exactly
--       while 'qn' > 0, and then expires at 'exp' too; 'exp' is at or after every
--       deadline in h (no key without a TTL, none outlives its use by more than the
--       padding). A holder's release that leaves the semaphore idle deletes them all
--       at once (fast_release, fast_release.lua). A q found while 'qn' is 0 (made by
--       hand, or left by an older version that kept q always) is not needed, and no
--       fast path reads it: check_keys() deletes it before the full logic runs.
--   K2  'used' = sum of the permits of the holders in h = number of 1 bits in s.
--   K3  'mind' <= the earliest deadline in h; a purge makes it exact.
--   K4  'qn' = number of waiters in q = number of waiter records = number of 'w:'
--       members in h.
--   K5  Never over the limit: a grant happens only when used + n <= limit.
--   K6  Fair order: while q is not empty, grants go to its head first (serve); a
--       caller that is not the head is granted only on an unfair semaphore.
--   K7  Time is read once, from TIME, at the top of the script; nothing uses the
--       client's clock. A holder or waiter is live while now < its deadline.
--   K8  Numbers handed to Redis go through int(): Lua would print 1.7e+15 otherwise.
--       int() formats with '%d' (a 64-bit integer, exact below 2^53 like every number
--       here), which costs the server far less than printing a float ('%.0f' or the
--       implicit '%.14g'); constant arguments are passed as strings for the same reason.
--   K9  Bounded work: one call serves or drops at most MAX_SERVE waiters, purges at
--       most MAX_PURGE expired entries, and touches at most 2 * limit slot bits, or in
--       a batch, whose acquires ask for at most MAX_LIMIT permits in all, 3 * MAX_LIMIT
--       (set by its grants, cleared of those set before it or by them) (the
--       limit and a permit count are at most MAX_LIMIT, 10,000, checked by the client
--       and by the scripts before their first write); what is left is done by the next
--       call, and a head that could be served at once is told to look again.
--
-- Failure points. Redis does not undo a script's writes, so every script either fails
-- before its first write or runs to its end. What can still fail, and why never after
-- a write:
--   - a key of the wrong type: check_keys() reads the TYPE of all four keys before
--     anything else and fails with WRONGTYPE (wrong_type) when h, i or s, or q while
--     someone queues, holds another type; otherwise it may repair (a write, after
--     which nothing can fail for a type, since every key then has the type the
--     commands expect, and q, when nobody queues, does not exist: the first waiter's
--     ZADD makes it a zset). In a batch, the fast operations that ran before it
--     wrote only after reads showing h, i and s of their types, and only while
--     nobody queued (fast.lua), so that check cannot fail after their writes;
--   - a bad argument (an id of another shape, a non-number, a fraction, a number out
--     of range, a missing one): checked before load() (int_arg; check_acquire in
--     fast_acquire.lua; an acquire's id, count and ticket in acquire_entry.lua,
--     before its fast path; a batch checks every operation first);
--   - out of memory: without a shebang flag, Redis refuses only a script's *first*
--     write when maxmemory is reached (and only a command that may use memory:
--     SETBIT, HSET, ZADD; not ZREM, HDEL, DEL), never a later one. So a release
--     (op_release, fast_release, a purge) removes the holder's entries before it
--     frees its slots, and runs out of memory (DESIGN invariant 12); the client puts
--     a batch's releases before its acquires for the same reason;
--   - PUBLISH refused by ACL (a user without the channel): sent with redis.pcall, its
--     error ignored; a waiter that misses a message looks again on its timer;
--   - an ACL user denied one of the other commands the scripts call: the README gives
--     the rule a user needs (every command the scripts call, the key and channel
--     patterns); a user denied some command fails at that command, which a user with
--     the documented rule never is;
--   - a Lua error: every unpack() is of a bounded list (K9, batches of at most 64
--     operations, refresh chunks of 500 ids);
--   - a slot migrating away on Redis Cluster (SETSLOT .. MIGRATING): the node runs a
--     script only while it holds every key the script names, and refuses a command on
--     a key it does not hold, so a key the script itself deleted (q, by the ZREM of its
--     last waiter) cannot be made again there. Only a waiter's queueing makes q after
--     earlier writes of the call; it does so with redis.pcall, and on a refusal saves
--     what the call did and answers TRYAGAIN without queueing its caller (op_acquire).
--     The repair of keys that disagree deletes all four and makes them again: it
--     first looks at a key of the slot that never exists, which such a node refuses,
--     and raises TRYAGAIN before its DEL (repair; the client reads the code from the
--     text Redis wraps it in, error.rs). In a batch the fast operations may have
--     written before: they leave the keys agreeing, except a release whose record
--     names slots that were not set, which marks the script `damaged` so that
--     check_keys() leaves the repair to the next call; and an idle release deletes
--     the keys only as the batch's last operation (no later one can then need them);
--   - records edited by hand: a holder record whose slot list names a slot SETBIT
--     refuses frees no slot (free_slots, slots_ok; the fast release leaves it to the
--     full logic), one whose bits cleared are not its permit count leaves 'used' and
--     s apart; after either the script grants nothing more (`damaged`), and the next
--     call repairs the disagreement; a waiter record that
--     does not parse, or holds a count, limit or time out of the ranges acquire
--     checks (a count past MAX_LIMIT would grant that many slots in one call, K9),
--     drops its waiter, and so does a queue member that is no permit id (serve); a live holder record that does not
--     parse is answered as a grant without token or slots, which the client refuses
--     as a malformed reply (grant_reply); a stored 'limit' or 'ctr' that is no
--     integer in range is ignored (new_state, fast_state; 'nan' and 'inf' would
--     otherwise pass tonumber()), so no such text reaches a comparison or int().
-- A key of another type (some other program's value under the semaphore's key name)
-- is an error, not a loss: every script that reads it fails with WRONGTYPE and writes
-- nothing (check_keys), so the holders keep their permits and nobody is granted one
-- until the key is deleted; then it is a partial loss. Two exceptions read only the
-- hash: the fast "no" to a try (it writes nothing), and the release of the last
-- permit, which deletes the semaphore's keys whatever they hold (fast_release.lua).
-- A q of another type while someone queues is refused only while h, i and s agree;
-- with them disagreeing the repair deletes it with the rest.
-- Partial loss (a key evicted or deleted): check_keys() sees that h, i and s (and q
-- while someone queues) do not all exist, or do not agree (the hash without its
-- state, a bitmap whose bits are not 'used'), keeps
-- 'ctr', 'limit' and 'cl' from the hash when it is readable, and starts the semaphore
-- afresh without holders or waiters. That never exceeds the limit and never books a slot twice; the holders it
-- drops learn it at their next renewal, waiters at their next look. The fast "no" to
-- a try (fast_acquire.lua) reads only the hash and writes nothing, and the release of
-- the last holder (fast_release.lua) deletes the keys whatever they hold, so
-- neither repairs: the next call that needs more does (a grant, another release, a
-- blocking acquire, a renewal, a status read, or a try once 'mind' has passed).

-- The key names, the constants, the time (`now`, `now_us`), int() and valid_id() are
-- defined by head.lua, which comes first in every script.

-- Fails the script (before any write: callers check first) for a bad argument.
local function refuse(what)
    return redis.error_reply('ERR redis-semaphore: ' .. what)
end

-- The fields of I that make up the state, in the order load() reads them.
local STATE = {'exp', 'used', 'mind', 'ctr', 'limit', 'qn', 'qseq'}

-- The state of a batch (batch.lua): one state shared by its operations, loaded once
-- and saved once. nil outside a batch.
local batch = nil

-- Builds the state from an HMGET of STATE (and maybe more fields after them).
-- Writes to I are kept in `over` (field -> value, or false to delete it) until save();
-- `pre` caches fields read from I (false: absent). A field is read through over first,
-- then pre, then I, so an operation sees every write made before it in the same script.
local function new_state(v)
    return {
        exists = v[1] ~= false,
        exp = tonumber(v[1]) or 0,
        used = tonumber(v[2]) or 0,
        mind = tonumber(v[3]) or END_OF_TIME,
        ctr = int_arg(v[4], 0, MAX_TOKEN) or 0,
        limit = int_arg(v[5], 1, MAX_LIMIT),
        qn = tonumber(v[6]) or 0,
        qseq = tonumber(v[7]) or 0,
        rec = false,
        wrec = false,
        dirty = false,
        over = {},
        pre = {},
        moved = false,
        budget = MAX_SERVE,
    }
end

-- Reads field f of I as the script sees it (pending writes first).
local function field(st, f)
    local v = st.over[f]
    if v ~= nil then return v end
    v = st.pre[f]
    if v == nil then
        v = redis.call('HGET', I, f)
        st.pre[f] = v
    end
    return v
end

local function put(st, f, v) st.over[f] = v end
local function del(st, f) st.over[f] = false end

-- Creates the keys of a semaphore that has none (q is made by the first waiter). Every
-- caller adds a deadline with extend() before it returns, which gives the keys their
-- TTL (K1).
local function create(st)
    redis.call('ZADD', H, int(END_OF_TIME), '~')
    redis.call('SETBIT', S, 0, 0)
    redis.call('HSET', I, 'used', 0)
    st.exists, st.exp, st.used, st.mind, st.qn, st.dirty = true, 0, 0, END_OF_TIME, 0, true
    st.rec, st.wrec = false, false
end

-- The keys do not agree (partial loss: a key missing, or keys whose contents disagree;
-- a key of another type is refused before, by check_keys): keep the
-- counters that the hash still holds and start again without holders or waiters.
-- Writes the new state at once (with a TTL: the old 'exp' when still ahead, so that a
-- stored limit keeps its retention, else one second) and returns it.
local function repair(info_is_hash)
    local kept = {false, false, false, false, false}
    if info_is_hash then
        kept = redis.call('HMGET', I, 'ctr', 'limit', 'cl', 'exp', 'lk')
    end
    -- The keys are made again after the DEL, which a node whose slot migrates away
    -- (Redis Cluster, SETSLOT .. MIGRATING) refuses for a key it does not hold: the
    -- DEL would go through and the first ZADD fail, the counters kept above lost with
    -- the keys. Such a node refuses any command on a key it does not hold, so a look
    -- at a key of the slot that never exists finds it out before anything is written
    -- (a read: cheap, and only on this rare path); the caller looks again (TRYAGAIN),
    -- once the keys have moved or the migration was called off.
    local probe = redis.pcall('EXISTS', H .. ':probe')
    if type(probe) == 'table' and probe.err and string.find(probe.err, 'non local key', 1, true) then
        error('TRYAGAIN redis-semaphore: the semaphore\'s keys disagree and need a repair, '
            .. 'which this node cannot make while its slot migrates away; nothing was written', 0)
    end
    redis.call('DEL', H, I, S, Q)
    local exp = tonumber(kept[4]) or 0
    if exp <= now then exp = now + 1000 end
    local ctr = tonumber(kept[1]) or 0
    redis.call('ZADD', H, int(END_OF_TIME), '~')
    redis.call('SETBIT', S, 0, 0)
    redis.call('HSET', I, 'exp', int(exp), 'used', 0, 'mind', int(END_OF_TIME), 'ctr', int(ctr),
        'qn', 0, 'qseq', 0)
    if kept[2] then redis.call('HSET', I, 'limit', kept[2]) end
    if kept[3] then redis.call('HSET', I, 'cl', kept[3]) end
    if kept[5] then redis.call('HSET', I, 'lk', kept[5]) end
    local e = int(exp)
    for k = 1, 3 do redis.call('PEXPIREAT', KEYS[k], e) end
    return new_state({int(exp), '0', false, int(ctr), kept[2], '0', '0'})
end

local KEY_TYPES = {{H, 'zset'}, {I, 'hash'}, {S, 'string'}, {Q, 'zset'}}

-- Fails the script with a WRONGTYPE error naming `key`, which holds a `found` where
-- the protocol keeps a `want`. Raised by check_keys() only, before any write. A
-- string error (level 0: no position), since Redis 6.2 cannot raise a table; the key
-- is shown with its bytes outside printable ASCII escaped (an error line that is not
-- UTF-8 or holds a line break cannot be parsed by the client).
local function wrong_type(key, found, want)
    local shown = string.gsub(string.sub(key, 1, 200), '[^%w%p ]', function(ch)
        return string.format('\\x%02x', string.byte(ch))
    end)
    error('WRONGTYPE redis-semaphore: key ' .. shown .. ' holds a ' .. found .. ', not the '
        .. want .. ' of the semaphore (another program writes under its name)', 0)
end

-- Checks that h, i and s exist with their types and agree (the hash holds the state,
-- and the slot bitmap has exactly 'used' bits set, K2), and that q is a zset while
-- someone queues, or that no key exists. A key of another type fails the script with
-- WRONGTYPE (wrong_type) before anything is written: it is some other program's
-- value, which the semaphore neither overwrites nor reads as its own (a repair would
-- drop holders whose permits are still valid). Repairs the rest (keys missing, or
-- disagreeing: see "Partial loss"). Returns the repaired state, or nil. A q found
-- while nobody queues ('qn' 0), of any type, is not needed (the fast paths do not
-- even read it) and is deleted (a write, after every check), so that the first
-- waiter's ZADD makes it afresh (K1).
local function check_keys()
    local present, right, q_type = 0, 0, 'none'
    for k = 1, 4 do
        local key, want = KEY_TYPES[k][1], KEY_TYPES[k][2]
        local ty = redis.call('TYPE', key)['ok']
        if ty ~= 'none' then present = present + 1 end
        if k < 4 then
            if ty == want then
                right = right + 1
            elseif ty ~= 'none' then
                wrong_type(key, ty, want)
            end
        else
            q_type = ty
        end
    end
    if present == 0 then return nil end
    if right == 3 then
        local v = redis.call('HMGET', I, 'exp', 'used', 'qn')
        local used = tonumber(v[2])
        -- (`damaged`: this script's own writes left 'used' and s apart, so the repair
        -- waits for the next call, whose check comes before any write)
        if v[1] and used and (damaged or redis.call('BITCOUNT', S) == used) then
            if (tonumber(v[3]) or 0) == 0 then
                if q_type ~= 'none' then redis.call('DEL', Q) end
                return nil
            end
            if q_type == 'zset' then return nil end
            if q_type ~= 'none' then wrong_type(Q, q_type, 'zset') end
        end
    end
    -- (the hash is a hash here, or absent: another type failed above)
    return repair(redis.call('EXISTS', I) == 1)
end

-- Reads the semaphore's state with one HMGET, after check_keys(); the holder and
-- waiter records of `id` are read along when it is given. In a batch, returns the
-- batch's state with the records of `id` as earlier operations of the batch left them
-- (and the limit the last acquire passed, `climit`, which the batch's one save writes
-- as 'cl', whatever operations come after that acquire).
local function load(id)
    if batch then
        batch.rec, batch.wrec = field(batch, id), field(batch, 'w:' .. id)
        batch.moved = false
        return batch
    end
    local repaired = check_keys()
    if repaired then return repaired end
    local v
    if id then
        v = redis.call('HMGET', I, 'exp', 'used', 'mind', 'ctr', 'limit', 'qn', 'qseq', id, 'w:' .. id)
    else
        v = redis.call('HMGET', I, unpack(STATE))
    end
    local st = new_state(v)
    st.rec, st.wrec = v[8] or false, v[9] or false
    if id then st.pre[id], st.pre['w:' .. id] = st.rec, st.wrec end
    return st
end

-- Starts a batch over the permit ids `ids`: the state and all their records in one
-- HMGET. Every load() until save(batch, true) returns this state.
local function begin_batch(ids)
    local repaired = check_keys()
    if repaired then
        batch = repaired
        for k = 1, #ids do
            batch.pre[ids[k]] = false
            batch.pre['w:' .. ids[k]] = false
        end
        return
    end
    local fields = {unpack(STATE)}
    for k = 1, #ids do
        fields[#fields + 1] = ids[k]
        fields[#fields + 1] = 'w:' .. ids[k]
    end
    local v = redis.call('HMGET', I, unpack(fields))
    batch = new_state(v)
    for k = #STATE + 1, #fields do batch.pre[fields[k]] = v[k] end
end

-- Writes back what changed, in one HDEL and one HSET. Inside a batch only the final
-- save (final = true) writes.
local function save(st, final)
    if st == batch and not final then return end
    local hset, hdel = {}, {}
    for f, v in pairs(st.over) do
        if v then
            hset[#hset + 1] = f
            hset[#hset + 1] = v
        else
            hdel[#hdel + 1] = f
        end
    end
    if #hdel > 0 then redis.call('HDEL', I, unpack(hdel)) end
    if not st.dirty and #hset == 0 then return end
    if st.climit then
        -- a read of the hash whose type check_keys proved: cannot fail
        local old = redis.call('HGET', I, 'cl')
        if old and old ~= st.climit then
            -- clients disagree on the limit: keep the other one for operators
            hset[#hset + 1] = 'cdl'
            hset[#hset + 1] = old
        end
        hset[#hset + 1] = 'cl'
        hset[#hset + 1] = st.climit
    end
    redis.call('HSET', I, 'used', int(st.used), 'ctr', int(st.ctr), 'mind', int(st.mind),
        'exp', int(st.exp), 'qn', int(st.qn), 'qseq', int(st.qseq), unpack(hset))
end

-- Creates the keys of a semaphore that has none (K1, K2, K4 hold for empty keys).
local function init(st)
    if st.exists then return end
    create(st)
end

-- Keeps K1 when a deadline is added: when 'exp' would fall before `deadline`, push it
-- to deadline + pad. The padding makes this run about once per `pad` ms under load.
local function extend(st, deadline, pad)
    if st.exp >= deadline then return end
    st.exp = deadline + pad
    if st.limit then
        -- a stored limit is kept for its retention ('lk', set_limit.lua) from each
        -- extension on, so it lasts as long as the semaphore is in use, not only as
        -- long as some lease runs (a moment without holders would delete it); a read
        -- of the hash, whose type check_keys proved: cannot fail
        local keep = int_arg(field(st, 'lk'), 1, MAX_MS)
        if keep and now + keep > st.exp then st.exp = now + keep end
    end
    local e = int(st.exp)
    redis.call('PEXPIREAT', H, e)
    redis.call('PEXPIREAT', I, e)
    redis.call('PEXPIREAT', S, e)
    if st.qn > 0 then redis.call('PEXPIREAT', Q, e) end
    st.dirty = true
end

-- Keeps K3 and K1 for a deadline just written to h, new or moved (a grant, a waiter's
-- heartbeat, a renewal, which never moves one earlier, or an adoption, which may when
-- its lease is shorter than the grant's): 'mind' at or below it, 'exp' at or after it.
local function deadline_set(st, deadline, pad)
    if deadline < st.mind then
        st.mind = deadline
        st.dirty = true
    end
    extend(st, deadline, pad)
end

-- Whether holder `id` (known to be in h) is still live. Needs no call while now is
-- before 'mind', a lower bound of every deadline in h (K3).
local function live(st, id)
    if now < st.mind then return true end
    local dl = tonumber(redis.call('ZSCORE', H, id))
    return dl ~= nil and dl > now
end

-- The deadline of holder `id` (known to be in h).
local function deadline_of(id)
    return tonumber(redis.call('ZSCORE', H, id)) or now
end

-- Frees the slots named in a holder record; returns its permit count. A slot list
-- that names a slot SETBIT refuses, or is longer than the slots of its permit count
-- can be (a record edited by hand: slots_ok) frees no slot, and one
-- whose bits cleared are not its permit count (slots that were not set, or fewer or
-- more slots than permits: edited by hand) frees them but leaves 'used' and s apart
-- (K2): in both cases nothing more is granted in this script (`damaged`; else the
-- permits the record claims beyond its bits would be granted again, past the limit),
-- and the next call's check_keys() repairs, as after the fast release.
local function free_slots(rec)
    local p, slots = string.match(rec, '^(%d+)|%d+|([%d,]*)|')
    p = tonumber(p) or 0
    if not slots or not slots_ok(slots, p) then
        slots = ''
        damaged = true
    end
    local cleared = 0
    for slot in string.gmatch(slots, '%d+') do
        cleared = cleared + redis.call('SETBIT', S, slot, '0')
    end
    if cleared ~= p then damaged = true end
    return p
end

-- How many more expired entries this script may purge (K9): the budget is the
-- script's, not each purge's, so the operations of a batch share it.
local purge_left = MAX_PURGE

-- Removes the holders and waiters whose deadline has passed (K2, K3, K4), at most
-- MAX_PURGE of them per script (K9): when more are left, 'mind' stays at the earliest
-- of them, so the next call goes on. Costs nothing but a comparison while now < 'mind'.
local function purge(st)
    if not st.exists or now < st.mind or purge_left <= 0 then return end
    while purge_left > 0 do
        local ids = redis.call('ZRANGEBYSCORE', H, '-inf', int(now), 'LIMIT', 0,
            int(math.min(128, purge_left)))
        if #ids == 0 then break end
        purge_left = purge_left - #ids
        local recs = redis.call('HMGET', I, unpack(ids))
        -- the entries go before the slots are freed: at maxmemory a script is refused
        -- only at its first write of a command that may use memory (SETBIT), and HDEL
        -- and ZREM use none, so a release that must purge first still runs
        redis.call('HDEL', I, unpack(ids))
        redis.call('ZREM', H, unpack(ids))
        for k = 1, #ids do
            if string.sub(ids[k], 1, 2) == 'w:' then
                redis.call('ZREM', Q, string.sub(ids[k], 3))
                if recs[k] then st.qn = st.qn - 1 end
                st.moved = true
            elseif recs[k] then
                st.used = st.used - free_slots(recs[k])
            end
        end
        for k = 1, #ids do
            st.over[ids[k]] = nil
            st.pre[ids[k]] = false
        end
    end
    if st.used < 0 then st.used = 0 end
    if st.qn < 0 then st.qn = 0 end
    local first = redis.call('ZRANGE', H, 0, 0, 'WITHSCORES')
    st.mind = tonumber(first[2]) or END_OF_TIME
    st.dirty = true
end

-- Grants n permits to `id` until `deadline` (the caller checked K5). Returns the reply
-- {1, now, token, deadline, slot...}. The lowest free slots are found by BITPOS from
-- the last one found, so n permits cost n BITPOS and n SETBIT calls.
local function grant(st, id, n, deadline, pad, origin)
    -- a record `id` still has is a lease that ended and that the purge's budget (K9)
    -- did not reach (a live one is answered before any grant): its permits and slots
    -- are freed first, or the new record would hide them, counted in 'used' and set in
    -- s for good (K2)
    local old = field(st, id)
    if old then
        st.used = math.max(st.used - free_slots(old), 0)
    end
    local reply = {1, now, 0, deadline}
    local slots = {}
    local from = 0
    for k = 1, n do
        local b = redis.call('BITPOS', S, '0', int(math.floor(from / 8)))
        -- a start past the string's end answers -1: every bit from `from` on is clear
        if b < 0 then b = from end
        local bs = int(b)
        redis.call('SETBIT', S, bs, '1')
        slots[k] = bs
        reply[k + 4] = b
        from = b + 1
    end
    local token = math.max(st.ctr + 1, now_us)
    st.ctr = token
    reply[3] = token
    redis.call('ZADD', H, int(deadline), id)
    deadline_set(st, deadline, pad)
    st.used = st.used + n
    put(st, id, int(n) .. '|' .. int(token) .. '|' .. table.concat(slots, ',') .. '|' .. int(now) .. '|' .. origin)
    st.dirty = true
    st.rec = false
    return reply
end

-- Takes waiter `id` out of the queue (K4).
local function dequeue(st, id)
    redis.call('ZREM', Q, id)
    redis.call('ZREM', H, 'w:' .. id)
    del(st, 'w:' .. id)
    st.qn = st.qn - 1
    if st.qn < 0 then st.qn = 0 end
    st.moved = true
    st.dirty = true
end

-- Parses "permits|token|slots|..." into the reply shape {1, now, token, deadline,
-- slot...}. A record that does not parse, or whose slot list slots_ok() refuses
-- (edited by hand: a list of any length would be copied into the reply), gives a
-- grant without token or slots, which the client refuses as a malformed reply: the
-- script still runs to its end (an earlier operation of a batch may have written).
local function grant_reply(rec, deadline)
    local p, tok, slots = string.match(rec, '^(%d+)|(%d+)|([%d,]*)|')
    local out = {1, now, 0, deadline}
    if not tok or not slots_ok(slots, tonumber(p)) then return out end
    out[3] = tonumber(tok)
    for slot in string.gmatch(slots, '%d+') do out[#out + 1] = tonumber(slot) end
    return out
end

-- Sends a wake-up; a PUBLISH refused (ACL) is not an error (see Failure points).
local function tell(chan, msg)
    if chan ~= '' then redis.pcall('PUBLISH', chan, msg) end
end

-- Serves the queue in order (K6): grants to the head while it fits, tells each served
-- waiter's client on its channel ("G id token deadline slots"), and drops a head that
-- asks for more than the limit ("F id limit"). When the queue moved and its new head
-- must still wait, that head is told when to look again ("H id retry_ms"), so that a
-- lease that ends without a release wakes it at that moment; when the call's budget
-- (K9) ran out first, it is told to look at once ("H id 0"). A served waiter's permit
-- first lasts only its heartbeat (at most its lease), and never past the heartbeat
-- deadline the waiter has in h: if its process died while it waited, the permit comes
-- back when its heartbeat would have ended, as its queue entry would have; its client
-- renews it to a full lease. A head whose heartbeat has ended (left by the purge's
-- budget) is dropped, not served. `caller`: the id of the acquire running this serve
-- (nil for other scripts), which is alive (it is calling now): its own grant lasts a
-- whole heartbeat from now. Returns the granted ids as a set.
local function serve(st, caller)
    local served = {}
    while st.qn > 0 and not damaged do
        local head = redis.call('ZRANGE', Q, 0, 0)[1]
        if not head or head == '~' then
            st.qn = 0
            st.dirty = true
            break
        end
        local wrec = valid_id(head) and field(st, 'w:' .. head)
        local n, wlimit, lease, pad, hb, chan
        if wrec then
            n, wlimit, lease, pad, hb, chan =
                string.match(wrec, '^(%d+)|(%d+)|(%d+)|(%d+)|(%d+)|([^|]*)|')
            -- numbers in the ranges acquire.lua checks its arguments against: a count
            -- or limit past MAX_LIMIT would grant that many slots in this one script
            -- (K9), one that cannot be killed once it wrote
            if chan and not (int_arg(n, 1, MAX_LIMIT) and int_arg(wlimit, 1, MAX_LIMIT)
                and int_arg(lease, 1, MAX_MS) and int_arg(pad, 0, MAX_MS)
                and int_arg(hb, 1, MAX_MS)) then
                chan = nil
            end
        end
        if not chan then
            -- a queue entry that is no permit id, without its record, or with one that
            -- does not parse or holds numbers out of range (edited by hand): dropped,
            -- and counted against K9
            if st.budget <= 0 then break end
            st.budget = st.budget - 1
            dequeue(st, head)
        else
            n = tonumber(n)
            local origin = string.match(wrec, '^%d+|%d+|%d+|%d+|%d+|[^|]*|(.*)$') or ''
            local limit = st.limit or tonumber(wlimit)
            if st.budget <= 0 then
                tell(chan, 'H ' .. head .. ' 0')
                break
            elseif n > limit then
                st.budget = st.budget - 1
                dequeue(st, head)
                tell(chan, 'F ' .. head .. ' ' .. limit)
            elseif st.used + n > limit then
                if st.moved then
                    local retry = -1
                    if st.mind < END_OF_TIME then retry = math.max(st.mind - now, 0) end
                    tell(chan, 'H ' .. head .. ' ' .. int(retry))
                end
                break
            else
                st.budget = st.budget - 1
                local deadline = now + math.min(tonumber(lease), tonumber(hb))
                if head ~= caller then
                    -- no later than the waiter's own heartbeat: a waiter whose process
                    -- died (or whose client left without its cancel) and is served just
                    -- before its heartbeat ends must not hold the permit a heartbeat
                    -- more (a read of h, whose type check_keys proved: cannot fail)
                    local alive = tonumber(redis.call('ZSCORE', H, 'w:' .. head)) or now
                    if alive < deadline then deadline = alive end
                end
                if deadline <= now then
                    -- its heartbeat has ended (the purge's budget, K9, left it): dead,
                    -- dropped as the purge would have
                    dequeue(st, head)
                else
                    local reply = grant(st, head, n, deadline, tonumber(pad), origin)
                    dequeue(st, head)
                    served[head] = reply
                    local msg = 'G ' .. head .. ' ' .. int(reply[3]) .. ' ' .. int(reply[4]) .. ' '
                    tell(chan, msg .. table.concat(reply, ',', 5))
                end
            end
        end
    end
    return served
end
