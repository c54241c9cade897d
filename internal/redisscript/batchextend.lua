-- batchextend: extend many mutexes in one round trip (distlock's renewal
-- scheduler), each as extend.lua does. On Cluster every key must be in
-- one hash slot.
-- KEYS[i] lock key i, for i = 1..n
-- ARGV[3i-2] owner value i, ARGV[3i-1] its new TTL in ms, ARGV[3i] '1'
-- when it has a label key (acquire.lua), else ''
-- Each lock's fence, KEYS[i]..':fence', is lengthened with it (to the
-- lock's expiry plus FENCE_GRACE_MS, see clock.lua).
-- A lock holds its owner value with or without the waited mark (waited.lua).
-- Returns one result per lock, in order: 1 extended, 0 not held.
local out = {}
for i = 1, #KEYS do
  local j = 3 * i - 2
  local v = redis.call('GET', KEYS[i])
  if same(v, ARGV[j]) then
    if ARGV[j + 2] == '1' then
      redis.call('PEXPIRE', KEYS[i] .. ':label', ARGV[j + 1])
    end
    redis.call('PEXPIRE', KEYS[i] .. ':fence', string.format('%d', tonumber(ARGV[j + 1]) + FENCE_GRACE_MS))
    out[i] = redis.call('PEXPIRE', KEYS[i], ARGV[j + 1])
  else
    out[i] = 0
  end
end
return out
