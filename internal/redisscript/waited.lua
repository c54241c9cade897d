-- waited: the mark a mutex's value carries once an attempt of another
-- owner was refused it (the text of this file is put in front of the
-- scripts that read or compare a mutex's value). The mark is one NUL byte
-- appended to the value, with APPEND, which keeps the lock's expiry: the
-- release sends its notice only when the value carries it (release.lua),
-- so a lock nobody asked for is released without a PUBLISH. An acquire
-- may also set the value marked (ARGV[1] carries the mark: acquire.lua).
-- Every compare of a mutex's value ignores the mark on either side (same),
-- and a tombstone is named after the unmarked value;
-- an owner value ending in a NUL byte is therefore refused before it gets
-- here (the redis package's ErrInvalid), so no two owners can be told
-- apart only by it.
local WAITED = '\0'
-- MARK_REFUSED: whether a refused attempt marks the lock (false in
-- AcquireQuiet, for a store that sends no notices).
local MARK_REFUSED = true
-- mark_waited marks the lock key, which holds v (false: nothing), unless
-- it is marked already or kept for the head of its line (a value that
-- starts with a NUL byte: queue.lua).
local function mark_waited(key, v)
  if MARK_REFUSED and v and string.byte(v, -1) ~= 0 and string.byte(v, 1) ~= 0 then
    redis.call('APPEND', key, WAITED)
  end
end
-- unmarked returns v without the mark.
local function unmarked(v)
  if string.byte(v, -1) == 0 then
    return string.sub(v, 1, -2)
  end
  return v
end
-- same reports whether v (false: nothing) is the owner value owner, either
-- of them with or without the mark.
local function same(v, owner)
  return v ~= false and v ~= nil and (v == owner or unmarked(v) == unmarked(owner))
end
