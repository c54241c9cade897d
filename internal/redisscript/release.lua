-- release: compare-and-delete, then tell waiters.
-- KEYS[1] lock key; it is also the release channel's name.
-- ARGV[1] owner value
-- ARGV[2] optional: 'PUBLISH' or 'SPUBLISH' to send a release notice on
--         channel KEYS[1] when someone waits: the lock's value carries the
--         waited mark (acquire.lua); absent or empty: no notice. The notice
--         is a hint: pcall, so a server without SPUBLISH (before 7.0) or an
--         ACL that denies PUBLISH never fails the release.
-- ARGV[3] optional: '1' when the lock has a label key (acquire.lua), to
--         delete with it
-- ARGV[4] optional: '1' to leave a trace of the release: the lock key is
--         renamed to KEYS[1]..':released' instead of deleted (one command
--         either way), which keeps the released owner value for what was
--         left of the lock's TTL (RENAME keeps the expiry), one key per
--         lock name (the next release overwrites it). A release that runs
--         again (go-redis sends a command again after a read error, when
--         the first run's reply was lost) finds its value there and
--         succeeds again, at the cost of one GET; a lock that expired, or
--         was deleted by anyone else, leaves no trace of its value.
-- The lock holds ARGV[1], with or without the waited mark (waited.lua).
-- A lock with the mark is kept for the head of its line, if anyone waits
-- in it, and the notice is addressed to the head (queue.lua); without a
-- line the notice goes to every waiter (an empty message).
-- Returns 1 when deleted (or, with a trace, deleted by an earlier run),
-- 0 when the key did not hold ARGV[1].
local trace = ARGV[4] == '1'
local v = redis.call('GET', KEYS[1])
if same(v, ARGV[1]) then
  if trace then
    redis.call('RENAME', KEYS[1], KEYS[1] .. ':released')
  else
    redis.call('DEL', KEYS[1])
  end
  if ARGV[3] == '1' then
    redis.call('DEL', KEYS[1] .. ':label')
  end
  if string.byte(v, -1) == 0 and ARGV[2] and ARGV[2] ~= '' then
    q_hand_on(KEYS[1], ARGV[2], q_now())
  end
  return 1
end
if trace then
  v = redis.call('GET', KEYS[1] .. ':released')
  if same(v, ARGV[1]) then
    return 1
  end
end
return 0
