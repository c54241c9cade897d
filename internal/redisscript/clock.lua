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
-- While a mutex's tombstone may exist (cleanup.lua), its fence holds the
-- last token negated: next_token keeps that mark while the lock's
-- tombstone hint (KEYS[1]..':dead', the clean-up's, which lives as long as
-- the longest-lived tombstone) lives, and reports it, so that acquire.lua
-- looks for a tombstone only then. A lock without a fence (its first
-- grant, or the first after its fence expired) asks the hint.
-- One TIME and one SET ... PX ... GET, which writes the server's time with
-- the fence's expiry and returns the last token at once; a second SET only
-- when the clock is not ahead of the last token (a step back, or two
-- grants within a microsecond) or a mark is kept. Redis before 6.2 has no
-- SET ... GET: a GET, then the SET. Anything in the fence that is not an
-- integer counts as 0 (the clock takes over); a fence of another type
-- fails the script.
-- Before Redis 5.0 a script had to ask for effects replication before it
-- could write after TIME; redis.replicate_commands is a no-op from 7.0 on.
if redis.replicate_commands then redis.replicate_commands() end
-- next_token returns the token; whether a tombstone of the lock may exist
-- (only with hint, the lock's tombstone hint key); and what the fence held
-- before (false: nothing), for a caller that takes no token after all.
local function next_token(fence, ttl, hint)
  local t = redis.call('TIME')
  local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
  local nowfmt = string.format('%d', now)
  local life = string.format('%d', tonumber(ttl) + FENCE_GRACE_MS)
  local prev = redis.pcall('SET', fence, nowfmt, 'PX', life, 'GET')
  if type(prev) == 'table' and prev.err then
    prev = redis.call('GET', fence)
    redis.call('SET', fence, nowfmt, 'PX', life)
  end
  local last = tonumber(prev) or 0
  local look = not prev or last < 0
  last = math.abs(last)
  local tok = now
  if last >= now then
    tok = last + 1
  end
  local marked = look and hint and redis.call('PTTL', hint) > 0
  if marked then
    redis.call('SET', fence, string.format('%d', -tok), 'PX', life)
  elseif tok ~= now then
    redis.call('SET', fence, string.format('%d', tok), 'PX', life)
  end
  return tok, marked, prev
end
