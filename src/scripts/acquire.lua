-- acquire: one run of op_acquire (ops.lua).
--
-- ARGV: 1 id, 2 permits n, 3 caller's limit, 4 lease ms, 5 pad ms, 6 heartbeat ms,
--       7 "pid|host|label", 8 mode ('t' or 'w'), 9 fair ('1' or '0'),
--       10 the caller's wake-up channel, 11 cutoff (server ms, '0': none)
-- Reply: op_acquire's.
-- Errors: a bad id or number, before anything is written.

local n = tonumber(ARGV[2])
if not valid_id(ARGV[1]) then return refuse('not a permit id') end
if not n or n < 1 then return refuse('bad permit count') end
return op_acquire(ARGV[1], n, ARGV[3], tonumber(ARGV[4]), tonumber(ARGV[5]), tonumber(ARGV[6]),
    ARGV[7], ARGV[8], ARGV[9] == '1', ARGV[10], tonumber(ARGV[11]) or 0)
