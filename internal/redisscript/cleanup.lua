-- cleanup: undo a failed acquire whose request may still be on its way.
-- KEYS[1] lock key; it is also the release channel's name.
-- ARGV[1] owner value
-- ARGV[2] tombstone TTL in milliseconds: the lease TTL
-- ARGV[3] optional: 'PUBLISH' or 'SPUBLISH', as for release.lua
-- Writes the tombstone of ARGV[1], KEYS[1]..':dead:'..ARGV[1], then
-- compare-and-deletes as release.lua does. An acquire of ARGV[1] that ran
-- before this script is deleted here; one that runs after it finds the
-- tombstone and does not take the lock (for as long as the tombstone lives:
-- one lease TTL).
-- A label key the acquire may have written goes with the lock.
-- Returns 1 when deleted, 0 when the key did not hold ARGV[1].
redis.call('SET', KEYS[1] .. ':dead:' .. ARGV[1], '1', 'PX', ARGV[2])
if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('DEL', KEYS[1], KEYS[1] .. ':label')
  if ARGV[3] and ARGV[3] ~= '' then
    redis.pcall(ARGV[3], KEYS[1], '')
  end
  return 1
end
return 0
