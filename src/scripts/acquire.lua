-- acquire: one run of op_acquire (ops.lua).
--
-- ARGV: 1 id, 2 permits n, 3 caller's limit, 4 lease ms, 5 pad ms, 6 heartbeat ms,
--       7 "pid|host|label", 8 mode ('t' or 'w'), 9 fair ('1' or '0'),
--       10 the caller's wake-up channel, 11 cutoff (server ms, '0': none),
--       12 (optional) the arrival ticket an earlier queued reply gave this wait
--       ('0' or absent: none; see op_acquire, ops.lua)
-- Reply: op_acquire's, or on the fast path one of its short forms (fast_acquire.lua).
-- Errors: a bad id, a count or limit that is no integer from 1 to MAX_LIMIT, a lease,
-- pad or heartbeat that is no integer from 1 to MAX_MS, a missing origin or channel,
-- a ticket that is no integer from 0 to MAX_TOKEN: all before anything is written
-- (check_acquire; the ticket and the id by acquire_entry.lua, before the fast path,
-- which does not use the ticket); a key of another type, WRONGTYPE
-- from load() (check_keys in common.lua), also before. One after writes, on Redis
-- Cluster: a waiter's queueing on a slot migrating away, after this call purged or
-- served the queue's last waiter, saves what the call did and answers TRYAGAIN, its
-- caller neither granted nor queued (op_acquire, ops.lua). The fast path (acquire_entry.lua)
-- answers a plain call before these run; it writes only with the arguments it uses
-- shown valid, and a "no" writes nothing.

if not valid_id(ARGV[1]) then return refuse('not a permit id') end
local bad = check_acquire(2)
if bad then return refuse(bad) end
return op_acquire(ARGV[1], tonumber(ARGV[2]), ARGV[3], tonumber(ARGV[4]), tonumber(ARGV[5]),
    tonumber(ARGV[6]), ARGV[7], ARGV[8], ARGV[9] == '1', ARGV[10], tonumber(ARGV[11]) or 0,
    int_arg(ARGV[12], 0, MAX_TOKEN) or 0)
