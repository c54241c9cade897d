-- extend: compare-and-PEXPIRE.
-- KEYS[1] lock key; ARGV[1] owner value, ARGV[2] new TTL in milliseconds.
-- Returns 1 when extended, 0 when the key did not hold ARGV[1].
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('PEXPIRE', KEYS[1], ARGV[2])
end
return 0
