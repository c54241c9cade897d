-- multiacquire: take several mutexes at once, all or none, in one round
-- trip (distlock's TryLockAll). Every key must be in one hash slot on
-- Cluster.
-- KEYS[2i-1] lock key i, KEYS[2i] its fence (clock.lua), for i = 1..n
-- ARGV[1] owner value (the same for every key), ARGV[2] TTL in ms
-- ARGV[3] optional: the holder's label (acquire.lua)
-- Returns the tokens, one per lock in order, when it took them all. When a
-- lock is held by another value, takes none and returns minus that
-- holder's remaining ms (0 when unknown). Fails with DEAD, taking none,
-- when the value's tombstone exists on any of the locks (cleanup.lua). A
-- lock that already holds the value counts as free (a resent request, as
-- in acquire.lua). A lock found held by another value gets the waited mark
-- (acquire.lua).
local held = {}
for i = 1, #KEYS, 2 do
  local v = redis.call('GET', KEYS[i])
  held[i] = v
  if v and not same(v, ARGV[1]) then
    mark_waited(KEYS[i], v)
    local ttl = redis.call('PTTL', KEYS[i])
    if ttl < 0 then
      return 0
    end
    return -ttl
  end
  if not v and redis.call('EXISTS', KEYS[i] .. ':dead:' .. unmarked(ARGV[1])) == 1 then
    return redis.error_reply('DEAD owner value given up by a failed acquire; acquire with a fresh one')
  end
end
local tokens = {}
for i = 1, #KEYS, 2 do
  -- A resent request keeps the waited mark its first run's lock got.
  redis.call('SET', KEYS[i], held[i] or ARGV[1], 'PX', ARGV[2])
  if ARGV[3] then
    redis.call('SET', KEYS[i] .. ':label', string.format('%d:', #ARGV[1]) .. ARGV[1] .. ARGV[3], 'PX', ARGV[2])
  end
  tokens[#tokens + 1] = next_token(KEYS[i + 1], ARGV[2], KEYS[i] .. ':dead')
end
return tokens
