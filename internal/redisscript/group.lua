-- group: helpers of the semaphore and read/write lock scripts (the text of
-- this file is put in front of theirs, after clock.lua's).
-- A semaphore or read/write lock keeps its holders in a sorted set scored
-- by their expiry, in milliseconds of the server's clock (TIME), and their
-- tokens and labels in a hash, field owner value -> "<token>:<label>"
-- (a read/write lock: "r<token>:<label>" or "w<token>:<label>"). The hash's
-- field '' (no owner value is empty) holds a semaphore's limit, or the
-- value of a read/write lock's writer. Both keys live as long as their
-- latest holder (lengthen), so nothing outlives its holders' TTLs.

-- now_ms returns the server's time in milliseconds.
local function now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end

-- lengthen makes key live at least ms more.
local function lengthen(key, ms)
  if redis.call('PTTL', key) < tonumber(ms) then
    redis.call('PEXPIRE', key, ms)
  end
end

-- each calls f with the items of list in slices small enough for unpack.
local function each(list, f)
  for i = 1, #list, 500 do
    f(unpack(list, i, math.min(i + 499, #list)))
  end
end

-- prune drops the holders of zset (and their records in hash) whose
-- expiry is not after now; with rw, the writer field too when it names
-- one of them.
local function prune(zset, hash, now, rw)
  local gone = redis.call('ZRANGEBYSCORE', zset, '-inf', now)
  if #gone == 0 then
    return
  end
  redis.call('ZREMRANGEBYSCORE', zset, '-inf', now)
  each(gone, function(...) redis.call('HDEL', hash, ...) end)
  if rw then
    local w = redis.call('HGET', hash, '')
    if w and not redis.call('ZSCORE', zset, w) then
      redis.call('HDEL', hash, '')
    end
  end
end

-- first_score is the lowest score of zset, or nil when it is empty.
local function first_score(zset)
  local f = redis.call('ZRANGE', zset, 0, 0, 'WITHSCORES')
  if #f == 0 then
    return nil
  end
  return tonumber(f[2])
end

-- notify sends a release notice on channel with cmd ('PUBLISH' or
-- 'SPUBLISH'; nothing when empty), never failing the script.
local function notify(cmd, channel)
  if cmd and cmd ~= '' then
    redis.pcall(cmd, channel, '')
  end
end

-- dead reports whether value's tombstone exists on lock (cleanup.lua).
local function dead(lock, value)
  return redis.call('EXISTS', lock .. ':dead:' .. value) == 1
end

local DEAD = 'DEAD owner value given up by a failed acquire; acquire with a fresh one'
