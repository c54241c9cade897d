-- acquire: take the lock if free, in one round trip.
-- KEYS[1] lock key
-- KEYS[2] fence counter (optional; same hash slot)
-- ARGV[1] owner value, ARGV[2] TTL in milliseconds
-- ARGV[3] optional: the holder's label, kept beside the lock in the key
--         KEYS[1]..':label' as "<length of the value>:<value><label>"
--         with the lock's expiry (inspect.lua shows it when the value is
--         the holder's; no compare reads it); absent or empty: no label key
-- ARGV[4] optional: '1' when the acquisition waits (backend.Lease.Waits):
--         a refused attempt then records its intent in the lock's line, or
--         renews it (queue.lua)
-- ARGV[5] optional: 'PUBLISH', 'SPUBLISH' or '', to tell the head of the
--         line that the lock is kept for it (as release.lua does)
-- Returns > 0 when acquired: the fencing token (next_token of KEYS[2], the
-- hybrid clock of clock.lua), or 1 when no fence key was given. Returns <= 0 when another owner holds the lock:
-- minus the holder's remaining milliseconds (0 when unknown).
-- Returns the error DEAD, and leaves the lock and fence as they were,
-- when the tombstone of ARGV[1], KEYS[1]..':dead:'..ARGV[1], exists
-- (cleanup.lua): this request was overtaken by its own clean-up (it was
-- delayed on the way), and its owner has given the value up. Scripts run
-- one at a time, so of a request and its clean-up the second sees the
-- first. The tombstone is looked up only once SET succeeded, and, with a
-- fence, only while next_token reports that one may exist (the clean-up's
-- hint lives, and marks the fence): an uncontended attempt pays nothing
-- for it. Its name is built here rather than passed: it shares KEYS[1]'s
-- hash tag, so it lives in its Cluster slot, and the request stays as
-- small as one without it.
-- When the lock already holds ARGV[1], this request is a second run of one
-- that took it: a client resent it after losing the first reply (go-redis
-- retries a command after a read timeout), or the first run was a copy of
-- an earlier attempt of the same acquisition that reached Redis late. It
-- is acquired then, with a fresh token, so that the lock is neither
-- reported held by another nor left to expire unowned, and its expiry is
-- set again from now: the first run may have set it before the sender
-- started this attempt, from which the holder counts the lock's validity,
-- and the lock must not end sooner than that. The value check costs a
-- contended attempt one GET.
-- A refused attempt marks the lock as waited for (mark_waited, once per
-- holder: one APPEND), so that its release sends a notice (release.lua);
-- a lock nobody asked for is released without one. ARGV[1] may carry the
-- mark itself: an acquisition that was refused before sets it so, as one
-- likely to be waited for (the redis package does).
-- The line (queue.lua): SET NX is all an attempt without the mark pays, so
-- a first attempt never looks at the line. A lock kept for the head of its
-- line refuses every other attempt (and a waiting one queues), and its
-- head takes it. A waiting attempt with the mark (one that queued) that
-- finds the lock free takes it only when no live intent precedes its own;
-- otherwise it keeps the lock for the head and tells the head, which is how
-- a head that died or did not hear its notice is passed over once its
-- intent lapsed.
local function dead()
  return redis.call('EXISTS', KEYS[1] .. ':dead:' .. unmarked(ARGV[1])) == 1
end
local function refuse()
  redis.call('DEL', KEYS[1])
  return redis.error_reply('DEAD owner value given up by a failed acquire; acquire with a fresh one')
end
local waits = MARK_REFUSED and ARGV[4] == '1'
local me = unmarked(ARGV[1])
-- queued records (renews) the waiter's intent when it waits, and returns
-- the refusal: minus the time left of what holds the lock.
local function queued(now)
  if waits and not dead() then
    local q, qx = q_keys(KEYS[1], '')
    q_join(q, qx, me, now or q_now(), ARGV[2])
  end
  local ttl = redis.call('PTTL', KEYS[1])
  if ttl < 0 then
    return 0
  end
  return -ttl
end
if redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then
  if not KEYS[2] and dead() then
    return refuse()
  end
  if waits and me ~= ARGV[1] then
    local q, qx = q_keys(KEYS[1], '')
    local now = q_now()
    local head = q_head(q, qx, now)
    if head and head ~= me then
      redis.call('DEL', KEYS[1])
      q_hand_on(KEYS[1], ARGV[5], now)
      return queued(now)
    end
    q_leave(q, qx, me)
  end
else
  local v = redis.call('GET', KEYS[1])
  if same(v, ARGV[1]) then
    redis.call('PEXPIRE', KEYS[1], ARGV[2])
  elseif v == RESERVED .. me then
    -- Kept for this waiter, the head of the line: its turn. Marked, so
    -- that its release looks at the line.
    redis.call('SET', KEYS[1], me .. WAITED, 'PX', ARGV[2])
    local q, qx = q_keys(KEYS[1], '')
    q_leave(q, qx, me)
  else
    mark_waited(KEYS[1], v)
    return queued(nil)
  end
end
-- Acquired.
local tok = 1
if KEYS[2] then
  local marked, prev
  tok, marked, prev = next_token(KEYS[2], ARGV[2], KEYS[1] .. ':dead')
  if marked and dead() then
    -- No token taken: the fence goes back to what it held.
    if prev then
      redis.call('SET', KEYS[2], prev, 'KEEPTTL')
    else
      redis.call('DEL', KEYS[2])
    end
    return refuse()
  end
end
if ARGV[3] and ARGV[3] ~= '' then
  redis.call('SET', KEYS[1] .. ':label', string.format('%d:', #ARGV[1]) .. ARGV[1] .. ARGV[3], 'PX', ARGV[2])
end
return tok
