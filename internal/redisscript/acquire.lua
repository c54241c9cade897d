-- acquire: take the lock if free, in one round trip.
-- KEYS[1] lock key
-- KEYS[2] fence counter (optional; same hash slot)
-- ARGV[1] owner value, ARGV[2] TTL in milliseconds
-- ARGV[3] optional: '1' to mark the lock as waited-on when it is held
-- Returns > 0 when acquired: the fencing token (INCR of KEYS[2]), or 1 when
-- no fence key was given. Returns <= 0 when another owner holds the lock:
-- minus the holder's remaining milliseconds (0 when unknown); with ARGV[3],
-- it then also sets the waited marker KEYS[1]..':waited', expiring with the
-- holder's lock, so that the holder's release publishes a notice
-- (release.lua): this attempt ran before that release, so the release sees
-- the marker.
-- Returns the error DEAD, and leaves the lock as it was, when the tombstone
-- of ARGV[1], KEYS[1]..':dead:'..ARGV[1], exists (cleanup.lua): this request
-- was overtaken by its own clean-up (it was delayed on the way), and its
-- owner has given the value up. Scripts run one at a time, so of a request
-- and its clean-up the second sees the first. The tombstone is looked up
-- only once SET succeeded: a contended attempt pays nothing for it.
-- The marker's and the tombstone's names are built here rather than passed:
-- they share KEYS[1]'s hash tag, so they live in its Cluster slot, and the
-- request stays as small as one without them.
if redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then
  if redis.call('EXISTS', KEYS[1] .. ':dead:' .. ARGV[1]) == 1 then
    redis.call('DEL', KEYS[1])
    return redis.error_reply('DEAD owner value given up by a failed acquire; acquire with a fresh one')
  end
  if KEYS[2] then
    return redis.call('INCR', KEYS[2])
  end
  return 1
end
local ttl = redis.call('PTTL', KEYS[1])
if ttl <= 0 then
  return 0
end
if ARGV[3] == '1' then
  redis.call('SET', KEYS[1] .. ':waited', '1', 'PX', ttl)
end
return -ttl
