-- semacquire: take a permit of a semaphore if one is free, in one round trip.
-- KEYS[1] lock key: names the release channel and the tombstones; not read
-- KEYS[2] holders: sorted set, owner value scored by expiry (server ms)
-- KEYS[3] records: hash, owner value -> "<token>:<label>", '' -> the limit
-- KEYS[4] fence (clock.lua)
-- ARGV[1] owner value, ARGV[2] TTL in ms, ARGV[3] limit, ARGV[4] label
-- ARGV[5] optional: '1' when the acquisition waits (backend.Lease.Waits):
--         a refused attempt then records (renews) its intent in the
--         semaphore's line (queue.lua)
-- ARGV[6] optional: 'PUBLISH', 'SPUBLISH' or '', to tell the next in line
--         when a grant from the line leaves a permit free
-- A request holds when a permit is free and fewer live intents precede its
-- own (all of them, without one) than permits are free: the line is kept
-- in order of arrival. Without a line (nobody waits) the attempt pays one
-- EXISTS for it.
-- Returns > 0 when acquired: the token. Returns <= 0 when limit holders
-- hold it: minus the time until the first of them expires, in ms. Fails
-- with LIMIT <their limit> when the live holders took it with another
-- limit, and with DEAD when the value's tombstone exists (as acquire.lua).
-- A value that already holds a permit (a resent request) gets it again,
-- with a fresh token and expiry, as acquire.lua does for a mutex.
local now = now_ms()
prune(KEYS[2], KEYS[3], now, false)
local n = redis.call('ZCARD', KEYS[2])
local limit = tonumber(ARGV[3])
if n > 0 then
  local lim = tonumber(redis.call('HGET', KEYS[3], ''))
  if lim and lim ~= limit then
    return redis.error_reply('LIMIT ' .. string.format('%d', lim))
  end
end
local q, qx = q_keys(KEYS[1], ':sem')
local inline = false
if not redis.call('ZSCORE', KEYS[2], ARGV[1]) then
  local blocked = n >= limit
  if not blocked and redis.call('EXISTS', q) == 1 then
    inline = true
    q_prune(q, qx, now)
    local ahead = redis.call('ZRANK', q, ARGV[1]) or redis.call('ZCARD', q)
    blocked = ahead >= limit - n
  end
  if blocked then
    if ARGV[5] == '1' and not dead(KEYS[1], ARGV[1]) then
      q_join(q, qx, ARGV[1], now, ARGV[2])
    end
    if n == 0 then
      return 0
    end
    return -(first_score(KEYS[2]) - now)
  end
  if dead(KEYS[1], ARGV[1]) then
    return redis.error_reply(DEAD)
  end
end
local tok = next_token(KEYS[4], ARGV[2])
redis.call('ZADD', KEYS[2], now + tonumber(ARGV[2]), ARGV[1])
redis.call('HSET', KEYS[3], '', ARGV[3], ARGV[1], string.format('%d:', tok) .. (ARGV[4] or ''))
lengthen(KEYS[2], ARGV[2])
lengthen(KEYS[3], ARGV[2])
if inline then
  q_leave(q, qx, ARGV[1])
  if n + 1 < limit then
    local head = q_head(q, qx, now)
    if head then
      q_tell(ARGV[6], KEYS[1], head)
    end
  end
end
return tok
