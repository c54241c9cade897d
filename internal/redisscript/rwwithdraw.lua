-- rwwithdraw: withdraw a waiting request's intent (rwacquire.lua), and tell
-- the requests it kept waiting.
-- KEYS[1] lock key: the release channel's name; not read
-- KEYS[2] writers' intents, KEYS[3] readers' intents, KEYS[4] expiries
-- ARGV[1] owner value, ARGV[2] 'PUBLISH', 'SPUBLISH' or ''
-- Returns 1 when an intent was withdrawn, 0 when there was none.
local n = redis.call('ZREM', KEYS[2], ARGV[1]) + redis.call('ZREM', KEYS[3], ARGV[1])
redis.call('ZREM', KEYS[4], ARGV[1])
if n == 0 then
  return 0
end
notify(ARGV[2], KEYS[1])
return 1
