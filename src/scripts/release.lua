-- release: one run of op_release (ops.lua).
--
-- ARGV: 1 id
-- Reply: op_release's.

return op_release(ARGV[1])
