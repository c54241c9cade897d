-- cleanup: undo a failed acquire whose request may still be on its way.
-- KEYS[1] lock key; it is also the release channel's name.
-- KEYS[2] optional: the lock's fence (clock.lua), when it has one
-- ARGV[1] owner value
-- ARGV[2] tombstone TTL in milliseconds: the lease TTL
-- ARGV[3] optional: 'PUBLISH' or 'SPUBLISH', as for release.lua
-- Writes the tombstone of ARGV[1], KEYS[1]..':dead:'..ARGV[1], then
-- compare-and-deletes as release.lua does. An acquire of ARGV[1] that ran
-- before this script is deleted here; one that runs after it finds the
-- tombstone and does not take the lock (for as long as the tombstone lives:
-- one lease TTL).
-- With a fence, an acquire looks for a tombstone only while the lock's
-- tombstone hint, KEYS[1]..':dead', lives (clock.lua): it is made to live
-- as long as the tombstone, and the fence, if there is one, is marked (its
-- token negated), which is how a grant learns, for free, to ask the hint.
-- A label key the acquire may have written goes with the lock.
-- Returns 1 when deleted, 0 when the key did not hold ARGV[1].
redis.call('SET', KEYS[1] .. ':dead:' .. unmarked(ARGV[1]), '1', 'PX', ARGV[2])
if KEYS[2] then
  local hint = KEYS[1] .. ':dead'
  if redis.call('PTTL', hint) < tonumber(ARGV[2]) then
    redis.call('SET', hint, '1', 'PX', ARGV[2])
  end
  -- pcall: a fence of another type must not keep the lock from going.
  local last = tonumber(redis.pcall('GET', KEYS[2]))
  if last and last > 0 then
    redis.call('SET', KEYS[2], string.format('%d', -last), 'KEEPTTL')
  end
end
-- The value's intent in the lock's line goes too, and a lock kept for it
-- is handed on (queue.lua).
local me = unmarked(ARGV[1])
local q, qx = q_keys(KEYS[1], '')
q_leave(q, qx, me)
local v = redis.call('GET', KEYS[1])
if same(v, ARGV[1]) or v == RESERVED .. me then
  redis.call('DEL', KEYS[1], KEYS[1] .. ':label')
  q_hand_on(KEYS[1], ARGV[3], q_now())
  return v ~= RESERVED .. me and 1 or 0
end
return 0
