-- groupextend: extend a semaphore's permit or a read/write lock's grant.
-- KEYS[1] lock key (not read), KEYS[2] holders, KEYS[3] records
-- ARGV[1] owner value, ARGV[2] new TTL in ms
-- Returns 1 when extended, 0 when the value holds no live grant.
local s = redis.call('ZSCORE', KEYS[2], ARGV[1])
if not s then
  return 0
end
local now = now_ms()
if tonumber(s) <= now then
  return 0
end
redis.call('ZADD', KEYS[2], 'XX', now + tonumber(ARGV[2]), ARGV[1])
lengthen(KEYS[2], ARGV[2])
lengthen(KEYS[3], ARGV[2])
return 1
