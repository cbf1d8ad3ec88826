-- release: one run of op_release (ops.lua).
--
-- ARGV: 1 id, 2 '1' to keep the keys of a semaphore the release leaves idle
--       (force_release; see fast_release), else absent or ''
-- Reply: op_release's.
-- Errors: an id that is not a permit id, before anything is written (so an id from
-- outside, such as force_release's, can never name a state field or a waiter); a key
-- of another type, WRONGTYPE from load() (check_keys in common.lua), also before.

if not valid_id(ARGV[1]) then return refuse('not a permit id') end
return op_release(ARGV[1])
