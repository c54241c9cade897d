-- extend: compare-and-PEXPIRE.
-- KEYS[1] lock key; ARGV[1] owner value, ARGV[2] new TTL in milliseconds.
-- ARGV[3] optional: '1' when the lock has a label key, to extend with it.
-- ARGV[4] optional: '1' when the lock has a fence, KEYS[1]..':fence', to
-- lengthen with it (to the lock's expiry plus FENCE_GRACE_MS, see
-- clock.lua): a mutex holder's token is the fence's value (inspect.lua).
-- The lock holds ARGV[1], with or without the waited mark (waited.lua).
-- Returns 1 when extended, 0 when the key did not hold ARGV[1].
local v = redis.call('GET', KEYS[1])
if same(v, ARGV[1]) then
  if ARGV[3] == '1' then
    redis.call('PEXPIRE', KEYS[1] .. ':label', ARGV[2])
  end
  if ARGV[4] == '1' then
    redis.call('PEXPIRE', KEYS[1] .. ':fence', string.format('%d', tonumber(ARGV[2]) + FENCE_GRACE_MS))
  end
  return redis.call('PEXPIRE', KEYS[1], ARGV[2])
end
return 0
