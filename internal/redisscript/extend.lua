-- extend: compare-and-PEXPIRE.
-- KEYS[1] lock key
-- ARGV[1] owner value, ARGV[2] new TTL in milliseconds
-- ARGV[3] optional: '1' to extend the waited marker KEYS[1]..':waited' with
--         the lock, so that it lives as long as the lock it was set against
--         and the release still publishes (acquire.lua, release.lua)
-- Returns 1 when extended, 0 when the key did not hold ARGV[1].
if redis.call('GET', KEYS[1]) == ARGV[1] then
  if ARGV[3] == '1' then
    redis.call('PEXPIRE', KEYS[1] .. ':waited', ARGV[2])
  end
  return redis.call('PEXPIRE', KEYS[1], ARGV[2])
end
return 0
