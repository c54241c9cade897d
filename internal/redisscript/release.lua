-- release: compare-and-delete, then tell waiters.
-- KEYS[1] lock key; it is also the release channel's name.
-- ARGV[1] owner value
-- ARGV[2] optional: 'PUBLISH' or 'SPUBLISH' to send a release notice on
--         channel KEYS[1]; absent or empty: no notice. The waited marker
--         KEYS[1]..':waited' (acquire.lua) is then deleted with the lock, in
--         one DEL, and the notice goes out only when it existed: only when
--         an attempt found the lock held. The notice is a hint: pcall, so a
--         server without SPUBLISH (before 7.0) or an ACL that denies PUBLISH
--         never fails the release.
-- Returns 1 when deleted, 0 when the key did not hold ARGV[1].
if redis.call('GET', KEYS[1]) == ARGV[1] then
  if ARGV[2] and ARGV[2] ~= '' then
    if redis.call('DEL', KEYS[1], KEYS[1] .. ':waited') == 2 then
      redis.pcall(ARGV[2], KEYS[1], '')
    end
  else
    redis.call('DEL', KEYS[1])
  end
  return 1
end
return 0
