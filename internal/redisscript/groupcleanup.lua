-- groupcleanup: undo a failed acquire of a semaphore or read/write lock
-- whose request may still be on its way, as cleanup.lua does for a mutex.
-- KEYS[1] lock key: names the tombstone and the release channel; not read
-- KEYS[2] holders, KEYS[3] records
-- KEYS[4], KEYS[5], KEYS[6] (a read/write lock): the intents' sets
-- ARGV[1] owner value, ARGV[2] tombstone TTL in ms (the lease TTL)
-- ARGV[3] 'PUBLISH', 'SPUBLISH' or ''
-- Writes the value's tombstone, then drops its grant and its intent: an
-- acquire of the value that ran before is undone here, one that runs
-- after finds the tombstone and records nothing.
-- Returns 1 when a live grant was dropped, else 0.
redis.call('SET', KEYS[1] .. ':dead:' .. ARGV[1], '1', 'PX', ARGV[2])
local held = 0
local s = redis.call('ZSCORE', KEYS[2], ARGV[1])
local tell = false
if s then
  redis.call('ZREM', KEYS[2], ARGV[1])
  redis.call('HDEL', KEYS[3], ARGV[1])
  if KEYS[4] and redis.call('HGET', KEYS[3], '') == ARGV[1] then
    redis.call('HDEL', KEYS[3], '')
  end
  if redis.call('ZCARD', KEYS[2]) == 0 then
    redis.call('DEL', KEYS[3])
  end
  if tonumber(s) > now_ms() then
    held, tell = 1, true
  end
end
if KEYS[4] then
  if redis.call('ZREM', KEYS[4], ARGV[1]) + redis.call('ZREM', KEYS[5], ARGV[1]) > 0 then
    tell = true
  end
  redis.call('ZREM', KEYS[6], ARGV[1])
else
  -- A semaphore: the value's intent in the line (queue.lua) goes, and the
  -- notice goes to the head.
  local q, qx = q_keys(KEYS[1], ':sem')
  if q_leave(q, qx, ARGV[1]) then
    tell = true
  end
  if tell then
    local head = q_head(q, qx, now_ms())
    if head then
      q_tell(ARGV[3], KEYS[1], head)
      tell = false
    end
  end
end
if tell then
  notify(ARGV[3], KEYS[1])
end
return held
