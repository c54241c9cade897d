-- rwacquire: take a read/write lock's read or write side, or take (keep)
-- a place in line, in one round trip.
-- KEYS[1] lock key: names the release channel and the tombstones; not read
-- KEYS[2] holders: sorted set, owner value scored by expiry (server ms)
-- KEYS[3] records: hash, owner value -> "r<token>:<label>" or
--         "w<token>:<label>", '' -> the writer's owner value
-- KEYS[4] fence (clock.lua): tokens, and the arrival numbers of intents
-- KEYS[5] writers' intents: sorted set, owner value scored by arrival
-- KEYS[6] readers' intents: likewise
-- KEYS[7] intents' expiries: sorted set, owner value scored by expiry
-- ARGV[1] owner value, ARGV[2] TTL in ms, ARGV[3] 'r' or 'w', ARGV[4] label
-- Requests are served in order of arrival, readers together (see
-- backend.KindChecker): a writer holds when nobody holds and no intent
-- precedes its own (without one: when there is no intent); a reader when
-- no writer holds and no writer's intent precedes its own. A request that
-- cannot hold records an intent numbered by arrival (taken from the fence,
-- so it orders with the tokens), which lasts the TTL and which each of its
-- attempts renews; it goes when the request holds, when it is withdrawn
-- (rwwithdraw.lua) or when it expires.
-- Returns > 0 when acquired: the token. Returns <= 0 otherwise: minus the
-- time until the first holder or intent expires, in ms. Fails with DEAD
-- when the value's tombstone exists, recording nothing.
local now = now_ms()
local v, ttl, w = ARGV[1], tonumber(ARGV[2]), ARGV[3] == 'w'
prune(KEYS[2], KEYS[3], now, true)
local gone = redis.call('ZRANGEBYSCORE', KEYS[7], '-inf', now)
if #gone > 0 then
  redis.call('ZREMRANGEBYSCORE', KEYS[7], '-inf', now)
  each(gone, function(...)
    redis.call('ZREM', KEYS[5], ...)
    redis.call('ZREM', KEYS[6], ...)
  end)
end
local line = KEYS[6]
if w then
  line = KEYS[5]
end
-- own is the request's arrival number, nil without an intent (ZSCORE
-- gives false then).
local own = tonumber(redis.call('ZSCORE', line, v) or nil)
-- ahead reports whether the intents of zset have one before own.
local function ahead(zset)
  local f = first_score(zset)
  return f ~= nil and (own == nil or f < own)
end
local held = redis.call('ZSCORE', KEYS[2], v)
local blocked = false
if not held then
  if w then
    blocked = redis.call('ZCARD', KEYS[2]) > 0 or ahead(KEYS[5]) or ahead(KEYS[6])
  else
    blocked = redis.call('HEXISTS', KEYS[3], '') == 1 or ahead(KEYS[5])
  end
  if dead(KEYS[1], v) then
    return redis.error_reply(DEAD)
  end
end
if blocked then
  if not own then
    redis.call('ZADD', line, string.format('%d', next_token(KEYS[4], ttl)), v)
  end
  redis.call('ZADD', KEYS[7], now + ttl, v)
  lengthen(line, ttl)
  lengthen(KEYS[7], ttl)
  local first = first_score(KEYS[2])
  local fi = first_score(KEYS[7])
  if first == nil or (fi ~= nil and fi < first) then
    first = fi
  end
  return -(first - now)
end
local tok = next_token(KEYS[4], ttl)
redis.call('ZADD', KEYS[2], now + ttl, v)
redis.call('HSET', KEYS[3], v, ARGV[3] .. string.format('%d:', tok) .. (ARGV[4] or ''))
if w then
  redis.call('HSET', KEYS[3], '', v)
end
if own then
  redis.call('ZREM', line, v)
  redis.call('ZREM', KEYS[7], v)
end
lengthen(KEYS[2], ttl)
lengthen(KEYS[3], ttl)
return tok
