-- relabel: compare-and-set the label of a mutex's holder.
-- KEYS[1] lock key; ARGV[1] owner value, ARGV[2] the new label.
-- When the lock holds ARGV[1], sets its label key, KEYS[1]..':label', to
-- "<length of the value>:<value><label>" (as acquire.lua writes it) with
-- the lock's time left, and returns 1; the lock itself, its expiry and
-- the fence are left as they are. Returns 0, touching nothing, when the
-- lock does not hold ARGV[1] (with or without the waited mark: waited.lua).
if not same(redis.call('GET', KEYS[1]), ARGV[1]) then
  return 0
end
local label = string.format('%d:', #ARGV[1]) .. ARGV[1] .. ARGV[2]
local ttl = redis.call('PTTL', KEYS[1])
if ttl > 0 then
  redis.call('SET', KEYS[1] .. ':label', label, 'PX', ttl)
else
  redis.call('SET', KEYS[1] .. ':label', label)
end
return 1
