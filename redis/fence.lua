-- fence: put in front of every fenced script's body (fence.go wraps the
-- body in a function of its own KEYS and ARGV).
-- KEYS[1] the fence key, KEYS[2] the fenced key, KEYS[3..] more keys
-- ARGV[1] the token, in decimal without leading zeros; ARGV[2..] the body's
-- The fence key holds the highest token accepted for the fenced key, in
-- the same form. Tokens are compared as decimal strings (a longer one is
-- larger; of equal length, by bytes): every uint64 compares right, where
-- Lua's numbers (doubles) would round those above 2^53.
-- A token below the fence's fails the script with the error
-- "STALE <the fence's token>", and nothing is written. Otherwise the token
-- becomes the fence's (an equal one changes nothing) and the body runs
-- with KEYS[2..] and ARGV[2..] as its KEYS and ARGV. Scripts run one at a
-- time, so no other fenced write comes between the check and the body.
local fence_highest = redis.call('GET', KEYS[1])
local fence_token = ARGV[1]
if fence_highest and (#fence_highest > #fence_token or (#fence_highest == #fence_token and fence_highest > fence_token)) then
  return redis.error_reply('STALE ' .. fence_highest)
end
if fence_highest ~= fence_token then
  redis.call('SET', KEYS[1], fence_token)
end
local fence_keys, fence_argv = {}, {}
for i = 2, #KEYS do fence_keys[i - 1] = KEYS[i] end
for i = 2, #ARGV do fence_argv[i - 1] = ARGV[i] end
