-- extend: compare-and-PEXPIRE.
-- KEYS[1] lock key
-- KEYS[2] waited marker (optional; same hash slot): extended with the lock,
--         so that it lives as long as the lock it was set against and the
--         release still publishes (acquire.lua, release.lua)
-- ARGV[1] owner value, ARGV[2] new TTL in milliseconds.
-- Returns 1 when extended, 0 when the key did not hold ARGV[1].
if redis.call('GET', KEYS[1]) == ARGV[1] then
  if KEYS[2] then
    redis.call('PEXPIRE', KEYS[2], ARGV[2])
  end
  return redis.call('PEXPIRE', KEYS[1], ARGV[2])
end
return 0
