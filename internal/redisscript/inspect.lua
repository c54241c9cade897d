-- inspect: read a lock's holders without touching anything.
-- A mutex: KEYS[1] lock key, KEYS[2] fence; ARGV[1] 'm'.
--   Returns {} when free, else {token, ms left, label, value}: the holder's
--   token is the fence's value (no grant came after the live one), its
--   label is the label key's (acquire.lua) when it names the holder's
--   value, and value is the owner value the lock holds (Redlock compares
--   it across nodes).
-- A semaphore or read/write lock: KEYS[1] lock key (not read), KEYS[2]
-- holders, KEYS[3] records (semacquire.lua, rwacquire.lua); ARGV[1] 'g'.
--   Returns {limit or '', record, ms left, record, ms left, ...} for the
--   live holders, in order of expiry.
if ARGV[1] == 'm' then
  local v = redis.call('GET', KEYS[1])
  if not v or string.byte(v, 1) == 0 then
    -- Free, or kept for the head of its line (queue.lua): no holder.
    return {}
  end
  v = unmarked(v)
  local label = ''
  local l = redis.call('GET', KEYS[1] .. ':label')
  if l then
    local n, rest = string.match(l, '^(%d+):(.*)$')
    if n and unmarked(string.sub(rest, 1, tonumber(n))) == v then
      label = string.sub(rest, tonumber(n) + 1)
    end
  end
  -- The fence's token: negated while a tombstone may exist (clock.lua).
  local tok = string.match(redis.call('GET', KEYS[2]) or '0', '^-?(%d+)$') or '0'
  return {tok, redis.call('PTTL', KEYS[1]), label, v}
end
local now = now_ms()
local out = {redis.call('HGET', KEYS[3], '') or ''}
local live = redis.call('ZRANGEBYSCORE', KEYS[2], '(' .. string.format('%d', now), '+inf', 'WITHSCORES')
for i = 1, #live, 2 do
  local rec = redis.call('HGET', KEYS[3], live[i])
  if rec then
    out[#out + 1] = rec
    out[#out + 1] = tonumber(live[i + 1]) - now
  end
end
return out
