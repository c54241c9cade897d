-- acquire: take the lock if free, in one round trip.
-- KEYS[1] lock key, KEYS[2] fence counter (optional; same hash slot)
-- ARGV[1] owner value, ARGV[2] TTL in milliseconds
-- Returns > 0 when acquired: the fencing token (INCR of KEYS[2]), or 1 when
-- no fence key was given. Returns <= 0 when another owner holds the lock:
-- minus the holder's remaining milliseconds (0 when unknown).
if redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then
  if KEYS[2] then
    return redis.call('INCR', KEYS[2])
  end
  return 1
end
local ttl = redis.call('PTTL', KEYS[1])
if ttl < 0 then
  return 0
end
return -ttl
