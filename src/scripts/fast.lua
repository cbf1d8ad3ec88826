-- Fast paths of the hot operations: a plain grant of one permit, a plain "no" to a
-- try, and a plain release, each with only the commands it needs. They run before
-- common.lua's machinery is even set up; whenever anything is not plain (the keys
-- missing or not agreeing, a waiter queued, an expired entry to purge, a repeated id,
-- several permits at once) they answer nil and write nothing, and the full logic
-- (common.lua, ops.lua) decides. They give exactly the reply and the state the full
-- logic would give in the same case, and keep the same invariants (common.lua), with
-- two differences:
--   - what they refuse: the fast path checks only the arguments it uses, so a plain
--     try whose unused ones (heartbeat, channel) are malformed is granted where the
--     full logic refuses it (the client never sends such arguments);
--   - damaged keys: the "no" to a try writes nothing and needs only the hash, so it
--     reads no other key, and is given where the full logic would first repair a
--     lost h or s by dropping every holder, or refuse a mistyped one (see
--     fast_acquire); so is the release of the last holder, which deletes the keys
--     whatever they hold, another program's value of another type included (see
--     fast_release). The next call that needs more repairs or refuses.
--
-- One script call may run several fast operations (a batch): the hash's state fields
-- are read once per call (fast_state) and kept in `fv` as the operations change them,
-- so each further operation reads only its own record. Every write is made at once
-- except the 'used' a release lowers, which fast_flush() writes once, before the
-- script returns or the full logic reads the hash; so K2 holds in Redis whenever
-- anything else can read it.
--
-- Parts: this file (the state the fast operations share), fast_acquire.lua (a grant or
-- a "no") and fast_release.lua (a release and fast_flush); a script carries only the
-- parts it calls (sources.rs).
--
-- Cost. Creating a closure costs the server about 250 instructions per local of the
-- script it captures (measured with scripts/server-instructions.sh), and a Lua table
-- with named fields about 4,000: every call creates the closures of its parts, so they
-- are few, capture few locals, and keep the state in the array HMGET returned.
--
-- Failure points: none after the first write. Every key is read before anything is
-- written, each read a redis.pcall whose error (a key of another type) means "not
-- plain", so every write is to a key whose type a read has shown. Out of memory
-- refuses only a script's first write. fast_flush() writes the hash, shown to be a
-- hash by the read that loaded `fv` (the only fast operation that removes it, the
-- idle release, forgets `fv`). Every argument a write takes is checked first: slot
-- numbers from a holder record by slots_ok() (a record edited by hand may name one
-- SETBIT refuses: not plain), the others are made by the script with int().

-- Whether this script has already seen h and s exist with their types and agree with
-- the hash (h holds its sentinel, s has exactly 'used' bits set), and has kept them
-- so since (q is not needed while nobody queues, K1). Within one script nobody else
-- writes, so the fast operations of a batch check the keys once: every fast write below keeps them agreeing, except a release whose
-- record names slots that were not set (a record edited by hand), which clears it, and
-- the idle release's DEL, which clears it too (the create branch checks that nothing
-- exists).
local keys_agree = false

-- The hash's state as the fast operations of this call have left it; nil until
-- fast_state() reads it, and again after the idle release deleted the keys. When the
-- hash has its 'exp' field:
--   fv[1] 'exp'   fv[2] 'used' (false: not a number)   fv[3] 'mind'   fv[4] 'ctr'
--   fv[5] 'limit' (false: none stored; -1: not a number, which the full logic handles)
--   fv[6] 'qn'    fv[7] 'cl' (text, false: none)
--   fv[8] true while 'used' differs from the hash's (a release lowered it)
-- 'exp' and 'ctr' stay text until a grant or a release needs them (tonumber() of text
-- costs the server about 2,000 instructions, of a number next to nothing), so a "no"
-- parses only what it decides on. Without 'exp' (fv[1] false: no semaphore, or a hash
-- the full logic repairs) fields 2-7 are as read, so that the create branch can see
-- whether any exists.
local fv = nil

-- Reads the state (once per call) and returns the holder record of `id` (false:
-- none), or nil when the hash is of another type. The first call of a script reads
-- the fields and the record in one HMGET; later ones read only the record.
local function fast_state(id)
    if fv then return redis.call('HGET', I, id) end
    local v = redis.pcall('HMGET', I, 'exp', 'used', 'mind', 'ctr', 'limit', 'qn', 'cl', id)
    if v.err then return nil end
    local rec = v[8]
    if v[1] then
        v[2], v[3] = tonumber(v[2]) or false, tonumber(v[3]) or END_OF_TIME
        v[5] = v[5] and (int_arg(v[5], 1, MAX_LIMIT) or -1)
        if v[6] == '0' then v[6] = 0 else v[6] = tonumber(v[6]) or 0 end
    end
    v[8] = false
    fv = v
    return rec
end
