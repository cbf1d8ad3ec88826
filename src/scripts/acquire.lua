-- acquire: one run of op_acquire (ops.lua).
--
-- ARGV: 1 id, 2 permits n, 3 caller's limit, 4 lease ms, 5 pad ms,
--       6 "pid|host|label", 7 mode ('t' or 'w'), 8 fair ('1' or '0'),
--       9 the caller's wake-up channel
-- Reply: op_acquire's.

return op_acquire(ARGV[1], tonumber(ARGV[2]), ARGV[3], tonumber(ARGV[4]), tonumber(ARGV[5]),
    ARGV[6], ARGV[7], ARGV[8] == '1', ARGV[9])
