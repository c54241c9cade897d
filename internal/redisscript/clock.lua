-- clock: the fencing token as a hybrid clock, shared by every script that
-- grants a lock (the text of this file is put in front of theirs).
-- next_token(fence, ttl) returns max(last token + 1, the server's time in
-- microseconds, from TIME) and stores it in the key fence as the new last
-- token, for ttl (the grant's TTL in ms) plus FENCE_GRACE_MS. Tokens therefore increase strictly while the fence key lives, and
-- when it is lost (a restart without persistence, a failover to a replica
-- that missed the last grants, a dataset rolled back to a snapshot) the
-- next token is still larger than every earlier one, which were issued at
-- earlier server times, as long as the server's clock (the new master's,
-- after a failover) is not behind the clock that issued them by more than
-- the time that passed since.
-- Microseconds since 1970 stay below 2^53 (the doubles Lua counts in hold
-- integers exactly up to there) until the year 2255. The value is written
-- with string.format('%d'): tostring would round it to 14 digits.
-- The fence holds the token as an integer; a fence written by an earlier
-- version (a plain counter) is simply behind the clock.
-- The fence expires FENCE_GRACE_MS (set in front of this text by
-- redisscript.go) after the lock it last served would: every grant writes
-- it with the lock's TTL plus that grace, and a renewal of a mutex
-- lengthens it with the lock (extend.lua, batchextend.lua). So no fence
-- outlives its lock by more than the grace, and a key locked once costs
-- nothing after it. Tokens do not go backwards when the fence has
-- expired: the next grant comes at least the grace after the last token
-- was issued, and takes the server's time, which has moved past it (the
-- counter runs ahead of the clock only by the grants within one
-- microsecond, one script each: never by the grace). A server clock
-- stepped back by more than the grace meanwhile breaks that, as it does
-- for a lost fence.
-- One GET and one SET: as many commands as an INCR and an INCRBY, and the
-- SET carries the expiry.
-- Before Redis 5.0 a script had to ask for effects replication before it
-- could write after TIME; redis.replicate_commands is a no-op from 7.0 on.
if redis.replicate_commands then redis.replicate_commands() end
local function next_token(fence, ttl)
  local t = redis.call('TIME')
  local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
  local tok = (tonumber(redis.call('GET', fence)) or 0) + 1
  if tok < now then
    tok = now
  end
  redis.call('SET', fence, string.format('%d', tok), 'PX', string.format('%d', tonumber(ttl) + FENCE_GRACE_MS))
  return tok
end
