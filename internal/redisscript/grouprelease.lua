-- grouprelease: give back a semaphore's permit or a read/write lock's
-- grant, and tell waiters.
-- KEYS[1] lock key: the release channel's name; not read
-- KEYS[2] holders, KEYS[3] records (semacquire.lua, rwacquire.lua)
-- ARGV[1] owner value
-- ARGV[2] 'PUBLISH', 'SPUBLISH' or '' (no notice), as for release.lua
-- ARGV[3] 'rw' for a read/write lock (its writer field), else ''
-- A semaphore's notice is addressed to the head of its line, if anyone
-- waits in it (queue.lua).
-- Returns 1 when the value held a live grant, now given back; 0 when it
-- held none (an expired one is dropped all the same).
local s = redis.call('ZSCORE', KEYS[2], ARGV[1])
if not s then
  return 0
end
local now = now_ms()
redis.call('ZREM', KEYS[2], ARGV[1])
redis.call('HDEL', KEYS[3], ARGV[1])
if ARGV[3] == 'rw' and redis.call('HGET', KEYS[3], '') == ARGV[1] then
  redis.call('HDEL', KEYS[3], '')
end
if redis.call('ZCARD', KEYS[2]) == 0 then
  redis.call('DEL', KEYS[3])
end
if tonumber(s) <= now then
  return 0
end
if ARGV[3] ~= 'rw' then
  -- A semaphore's permit goes to the head of its line (queue.lua).
  local q, qx = q_keys(KEYS[1], ':sem')
  local head = q_head(q, qx, now)
  if head then
    q_tell(ARGV[2], KEYS[1], head)
    return 1
  end
end
notify(ARGV[2], KEYS[1])
return 1
