-- queue: the line of a mutex's or a semaphore's waiters (backend.Queuer);
-- the text of this file is put in front of the scripts that keep it, after
-- waited.lua's (and group.lua's, for a semaphore).
-- A line is two sorted sets named after the lock key: q holds the waiters'
-- owner values (unmarked) scored by arrival (1 + the last one's), qx the
-- same values scored by the expiry of their intent, in milliseconds of the
-- server's clock. An attempt of a waiting acquisition that cannot hold
-- records its intent, or renews it, for one TTL; the intent goes when the
-- waiter holds, withdraws (withdraw.lua), is cleaned up, or lapses. Both
-- sets live as long as their latest intent.
-- A mutex released while someone waits is kept for the head of its line:
-- the lock key holds RESERVED followed by the head's value, for what is
-- left of the head's intent, so that a newcomer's SET NX is refused (and
-- queues), and only the head takes it (acquire.lua). No owner value starts
-- with RESERVED's NUL byte (the redis package refuses them), so a
-- reservation is never taken for a holder's value.
-- The scripts that read the server's clock and then write replicate their
-- effects, not the script (the default from Redis 5 on).
if redis.replicate_commands then redis.replicate_commands() end

local RESERVED = '\0'

-- q_now returns the server's time in milliseconds.
local function q_now()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end

-- q_keys returns the line's two keys for the lock key lock and the kind's
-- suffix ('' for a mutex, ':sem' for a semaphore).
local function q_keys(lock, kind)
  return lock .. kind .. ':q', lock .. kind .. ':qx'
end

-- q_prune drops the lapsed intents of the line q, qx.
local function q_prune(q, qx, now)
  local gone = redis.call('ZRANGEBYSCORE', qx, '-inf', now)
  if #gone == 0 then
    return
  end
  redis.call('ZREMRANGEBYSCORE', qx, '-inf', now)
  for i = 1, #gone, 500 do
    redis.call('ZREM', q, unpack(gone, i, math.min(i + 499, #gone)))
  end
end

-- q_head returns the first live waiter's value and the milliseconds its
-- intent has left, or nil when nobody waits. It drops lapsed intents.
local function q_head(q, qx, now)
  q_prune(q, qx, now)
  local h = redis.call('ZRANGE', q, 0, 0)
  if #h == 0 then
    return nil, 0
  end
  local x = tonumber(redis.call('ZSCORE', qx, h[1]) or now)
  return h[1], x - now
end

-- q_lengthen makes key live at least ms more.
local function q_lengthen(key, ms)
  if redis.call('PTTL', key) < tonumber(ms) then
    redis.call('PEXPIRE', key, ms)
  end
end

-- q_join records v's intent at the end of the line, or renews the one it
-- has, for ttl ms from now.
local function q_join(q, qx, v, now, ttl)
  if not redis.call('ZSCORE', q, v) then
    local last = redis.call('ZRANGE', q, -1, -1, 'WITHSCORES')
    local n = 1
    if #last > 0 then
      n = tonumber(last[2]) + 1
    end
    redis.call('ZADD', q, string.format('%d', n), v)
  end
  redis.call('ZADD', qx, string.format('%d', now + tonumber(ttl)), v)
  q_lengthen(q, ttl)
  q_lengthen(qx, ttl)
end

-- q_leave drops v's intent; it reports whether there was one.
local function q_leave(q, qx, v)
  redis.call('ZREM', qx, v)
  return redis.call('ZREM', q, v) == 1
end

-- q_tell sends a notice on channel with cmd ('PUBLISH' or 'SPUBLISH';
-- nothing when empty) addressed to the owner value to ('' : to every
-- waiter), never failing the script.
local function q_tell(cmd, channel, to)
  if cmd and cmd ~= '' then
    redis.pcall(cmd, channel, to)
  end
end

-- q_hand_on keeps the free mutex lock for the head of its line and tells
-- the head, or, when nobody waits, frees it (if it holds a reservation)
-- and tells every waiter. It returns the head's value, or nil.
local function q_hand_on(lock, cmd, now)
  local q, qx = q_keys(lock, '')
  local head, left = q_head(q, qx, now)
  if head and left > 0 then
    redis.call('SET', lock, RESERVED .. head, 'PX', string.format('%d', left))
    q_tell(cmd, lock, head)
    return head
  end
  local v = redis.call('GET', lock)
  if v and string.byte(v, 1) == 0 then
    redis.call('DEL', lock)
  end
  q_tell(cmd, lock, '')
  return nil
end
