-- release: compare-and-delete, then tell waiters.
-- KEYS[1] lock key; it is also the release channel's name.
-- ARGV[1] owner value
-- ARGV[2] optional: 'PUBLISH' or 'SPUBLISH' to send a release notice on
--         channel KEYS[1]; absent or empty: no notice. The notice is a hint:
--         pcall, so a server without SPUBLISH (before 7.0) or an ACL that
--         denies PUBLISH never fails the release.
-- ARGV[3] optional: '1' when the lock has a label key (acquire.lua), to
--         delete with it
-- Returns 1 when deleted, 0 when the key did not hold ARGV[1].
if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('DEL', KEYS[1])
  if ARGV[3] then
    redis.call('DEL', KEYS[1] .. ':label')
  end
  if ARGV[2] and ARGV[2] ~= '' then
    redis.pcall(ARGV[2], KEYS[1], '')
  end
  return 1
end
return 0
