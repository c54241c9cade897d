-- clock: the fencing token as a hybrid clock, shared by every script that
-- grants a lock (the text of this file is put in front of theirs).
-- next_token(fence) returns max(last token + 1, the server's time in
-- microseconds, from TIME) and stores it in the key fence as the new last
-- token. Tokens therefore increase strictly while the fence key lives, and
-- when it is lost (a restart without persistence, a failover to a replica
-- that missed the last grants, a dataset rolled back to a snapshot) the
-- next token is still larger than every earlier one, which were issued at
-- earlier server times, as long as the server's clock (the new master's,
-- after a failover) is not behind the clock that issued them by more than
-- the time that passed since.
-- Microseconds since 1970 stay below 2^53 (the doubles Lua counts in hold
-- integers exactly up to there) until the year 2255. The value is written
-- with string.format('%d'): tostring would round it to 14 digits.
-- The fence holds an integer, as INCR needs; a fence written by an earlier
-- version (a plain counter) is simply behind the clock.
-- Before Redis 5.0 a script had to ask for effects replication before it
-- could write after TIME; redis.replicate_commands is a no-op from 7.0 on.
if redis.replicate_commands then redis.replicate_commands() end
local function next_token(fence)
  local t = redis.call('TIME')
  local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
  local tok = redis.call('INCR', fence)
  if tok < now then
    -- INCRBY costs the server less than a GET and a SET of the value.
    tok = redis.call('INCRBY', fence, string.format('%d', now - tok))
  end
  return tok
end
