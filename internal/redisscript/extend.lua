-- extend: compare-and-PEXPIRE.
-- KEYS[1] lock key; ARGV[1] owner value, ARGV[2] new TTL in milliseconds.
-- ARGV[3] optional: '1' when the lock has a label key, to extend with it.
-- Returns 1 when extended, 0 when the key did not hold ARGV[1].
if redis.call('GET', KEYS[1]) == ARGV[1] then
  if ARGV[3] then
    redis.call('PEXPIRE', KEYS[1] .. ':label', ARGV[2])
  end
  return redis.call('PEXPIRE', KEYS[1], ARGV[2])
end
return 0
