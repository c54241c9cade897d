-- release: compare-and-delete, then tell waiters.
-- KEYS[1] lock key; it is also the release channel's name.
-- KEYS[2] waited marker (optional; same hash slot), set by acquire.lua when
--         an attempt found the lock held
-- ARGV[1] owner value
-- ARGV[2] optional: 'PUBLISH' or 'SPUBLISH' to send a release notice on
--         channel KEYS[1]; absent or empty: no notice. With KEYS[2], the
--         notice goes out only when the marker exists (someone tried while
--         the lock was held), and the marker is deleted with the lock, in
--         one DEL; without it, always. The notice is a hint: pcall, so a
--         server without SPUBLISH (before 7.0) or an ACL that denies PUBLISH
--         never fails the release.
-- Returns 1 when deleted, 0 when the key did not hold ARGV[1].
if redis.call('GET', KEYS[1]) == ARGV[1] then
  local notify = ARGV[2] and ARGV[2] ~= ''
  if KEYS[2] then
    notify = redis.call('DEL', KEYS[1], KEYS[2]) == 2 and notify
  else
    redis.call('DEL', KEYS[1])
  end
  if notify then
    redis.pcall(ARGV[2], KEYS[1], '')
  end
  return 1
end
return 0
