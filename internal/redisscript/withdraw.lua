-- withdraw: withdraw a waiting mutex or semaphore request's intent from
-- the lock's line (queue.lua), and tell the waiters it kept waiting.
-- KEYS[1] lock key: names the line and the release channel
-- ARGV[1] owner value (unmarked)
-- ARGV[2] 'PUBLISH', 'SPUBLISH' or ''
-- ARGV[3] '' for a mutex, ':sem' for a semaphore
-- A mutex kept for the value (it was the head) is handed on to the next in
-- line, or freed. A semaphore's new head is told that it may try (a
-- withdrawn intent may have kept it out).
-- Returns 1 when an intent was withdrawn, 0 when there was none.
local q, qx = q_keys(KEYS[1], ARGV[3])
local had = q_leave(q, qx, ARGV[1])
if ARGV[3] == '' then
  if redis.call('GET', KEYS[1]) == RESERVED .. ARGV[1] then
    redis.call('DEL', KEYS[1])
    q_hand_on(KEYS[1], ARGV[2], q_now())
  end
elseif had then
  local head = q_head(q, qx, q_now())
  if head then
    q_tell(ARGV[2], KEYS[1], head)
  end
end
if had then
  return 1
end
return 0
