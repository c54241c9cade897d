-- acquire: take the lock if free, in one round trip.
-- KEYS[1] lock key
-- KEYS[2] the tombstone of ARGV[1] (DeadKey; same hash slot), written by
--         cleanup.lua
-- KEYS[3] fence counter (optional; same hash slot)
-- KEYS[4] waited marker (optional, after KEYS[3]; same hash slot)
-- ARGV[1] owner value, ARGV[2] TTL in milliseconds
-- Returns > 0 when acquired: the fencing token (INCR of KEYS[3]), or 1 when
-- no fence key was given. Returns <= 0 when another owner holds the lock:
-- minus the holder's remaining milliseconds (0 when unknown); with KEYS[4],
-- it then also sets the waited marker, expiring with the holder's lock, so
-- that the holder's release publishes a notice (release.lua): this attempt
-- ran before that release, so the release sees the marker.
-- Returns the error DEAD, and leaves the lock as it was, when the tombstone
-- of ARGV[1] exists: this request was overtaken by its own clean-up (it was
-- delayed on the way), and its owner has given the value up. Scripts run
-- one at a time, so of a request and its clean-up the second sees the
-- first. The tombstone is looked up only once SET succeeded: a contended
-- attempt pays nothing for it.
if redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then
  if redis.call('EXISTS', KEYS[2]) == 1 then
    redis.call('DEL', KEYS[1])
    return redis.error_reply('DEAD owner value given up by a failed acquire; acquire with a fresh one')
  end
  if KEYS[3] then
    return redis.call('INCR', KEYS[3])
  end
  return 1
end
local ttl = redis.call('PTTL', KEYS[1])
if ttl <= 0 then
  return 0
end
if KEYS[4] then
  redis.call('SET', KEYS[4], '1', 'PX', ttl)
end
return -ttl
