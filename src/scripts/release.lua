-- release: give back the permits of permit id ARGV[1].
--
-- Reply: 1 released while its lease was live
--        2 released, but its lease had already ended (nobody had taken it yet)
--        0 not held: unknown id, already released, or purged after its lease ended
--
-- Keeps: only the permits recorded for this id are freed, so running it twice (a
-- resent command) frees nothing the second time and never someone else's permit
-- (K2: the holder, its slot bits and its share of 'used' leave together).

local id = ARGV[1]
local v = redis.call('HMGET', I, 'used', id)
if not v[2] then return 0 end
local dl = tonumber(redis.call('ZSCORE', H, id))
redis.call('ZREM', H, id)
local used = (tonumber(v[1]) or 0) - free_slots(v[2])
if used < 0 then used = 0 end
redis.call('HDEL', I, id)
redis.call('HSET', I, 'used', used)
if dl and dl > now then return 1 end
return 2
