-- The fast release, and the write of what fast operations left pending (see
-- fast.lua, whose state they use).

-- Release `id`; nil when not plain. `keep`: never delete the keys (see the idle
-- release below).
-- Plain: the hash holds its state and a record for `id`, nobody is queued (so nobody
-- is served, and q is not needed: K1), h and s exist with their types and agree (h
-- holds its sentinel and, when a deadline may have passed, `id`; s has exactly
-- 'used' bits set). The idle release below needs only the hash (and h when a
-- deadline may have passed): it deletes the other keys whatever they hold.
-- Reply: op_release's 1 (live) or 2 (its lease had ended).
--
-- Idle semaphores leave no keys behind: a holder's own release (not `keep`, which
-- force_release passes so that the holder it names learns LostReason::Released, not
-- Reset, and a batch for every operation but its last) that leaves nobody holding or queued, and no stored limit, deletes the
-- keys instead of writing them, so an idle semaphore costs no memory (its keys would
-- otherwise stay until 'exp', about a lease). Nothing is lost: there are no holders or waiters, 'qseq' orders only
-- waiters present, 'cl' is shown to operators only, and 'ctr' is needed only to keep
-- tokens increasing: the next token is at least the server's TIME in microseconds
-- then, so the keys are deleted only while 'ctr' is below now_us (a batch that
-- granted several tokens in one microsecond leaves the keys to their TTL).
local function fast_release(id, keep)
    local rec = fast_state(id)
    local v = fv
    if not rec or not v[1] or v[6] ~= 0 or not v[2] then return nil end
    local p, slots = string.match(rec, '^(%d+)|%d+|([%d,]*)|')
    -- (a slot SETBIT would refuse, in a record edited by hand, is not plain: no
    -- SETBIT below may fail after this operation's or an earlier one's writes)
    p = tonumber(p)
    if not p or not slots_ok(slots, p) then return nil end
    -- live while now is before 'mind', a lower bound of every deadline in h (K3);
    -- else its deadline in h says (h must hold it: else the full logic repairs)
    local live = now < v[3]
    if not live then
        local dl = redis.pcall('ZSCORE', H, id)
        if type(dl) ~= 'string' then return nil end
        live = tonumber(dl) > now
    end
    local reply = 2
    if live then reply = 1 end
    if not keep and v[2] == p and not v[5] and (tonumber(v[4]) or 0) < now_us then
        -- idle: 'qn' is 0 and, by K2 and K4 on the hash (which holds the state), no
        -- holder or waiter but `id` exists; the DEL needs no proof that the other
        -- keys exist with their types and agree, as it removes them whatever they hold
        redis.call('DEL', H, I, S, Q)
        keys_agree = false
        fv = nil
        return reply
    end
    -- h holds its sentinel and s agrees with 'used' (K2; so it exists, used >= p >=
    -- 1); q is not read (nobody queues, so nothing in it is needed, K1)
    if not keys_agree then
        local hs, bits = redis.pcall('ZSCORE', H, '~'), redis.pcall('BITCOUNT', S)
        if type(hs) ~= 'string' or bits ~= v[2] then return nil end
        keys_agree = true
    end
    local used = v[2] - p
    if used < 0 then used = 0 end
    -- the holder's entries go first: at maxmemory Redis refuses a script (without a
    -- shebang) only at its first write of a command that may use memory (SETBIT,
    -- HSET), and ZREM and HDEL use none, so a release still runs out of memory
    -- (DESIGN invariant 12); `id` has a record, so the HDEL writes
    redis.call('ZREM', H, id)
    redis.call('HDEL', I, id)
    local cleared = 0
    for slot in string.gmatch(slots, '%d+') do
        cleared = cleared + redis.call('SETBIT', S, slot, '0')
    end
    -- a record that named slots not set (edited by hand) leaves 'used' and s apart,
    -- after this call's writes: as the full logic's free_slots does, nothing more is
    -- granted in this script (`damaged`), and the next call's check_keys() repairs
    -- (a repair here could fail after the writes, on a slot that migrates away)
    if cleared ~= p then
        keys_agree = false
        damaged = true
    end
    v[2], v[8] = used, true
    return reply
end

-- Writes what the fast operations left pending (the 'used' of releases).
local function fast_flush()
    if fv and fv[8] then
        redis.call('HSET', I, 'used', int(fv[2]))
        fv[8] = false
    end
end
