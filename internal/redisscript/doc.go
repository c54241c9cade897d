// Package redisscript holds the Lua scripts and the key layout of a distlock
// lock in Redis, shared by the single-Redis backend
// (github.com/distlock/distlock/redis) and the Redlock backend, so that both
// store a lock the same way and neither copies the other.
//
// # Key layout
//
// A lock on key k under prefix p uses, all in one Redis Cluster hash slot:
//
//	p{E(k)}        the lock: a string holding the owner value, with a PX expiry
//	p{E(k)}:fence  the fence: the last token handed out, expiring
//	               [FenceGrace] after the lock it last served would
//	p{E(k)}:dead:v the tombstone of owner value v, written by [Cleanup] and
//	               living one lease TTL: [Acquire] of v does not take the lock
//	               while it exists
//	p{E(k)}:label  a mutex holder's label, "<len(v)>:<v><label>", with the
//	               lock's expiry (only when the holder has a label)
//	p{E(k)}        also the name of the release notice channel (channels and
//	               keys are separate namespaces), for locks of every kind
//
// k's semaphore and read/write lock are distinct locks, in keys of their
// own, in the same slot:
//
//	p{E(k)}:sem        holders: sorted set, owner value by expiry (server ms)
//	p{E(k)}:sem:h      hash: owner value -> "<token>:<label>"; '' -> limit
//	p{E(k)}:sem:fence  the semaphore's last token (expiring as the fence)
//	p{E(k)}:rw         holders: sorted set, owner value by expiry
//	p{E(k)}:rw:h       hash: owner value -> "r<token>:<label>" or
//	                   "w<token>:<label>"; '' -> the writer's owner value
//	p{E(k)}:rw:fence   the last token, which also numbers intents (expiring
//	                   as the fence)
//	p{E(k)}:rw:qw      waiting writers' intents: owner value by arrival
//	p{E(k)}:rw:qr      waiting readers' intents: owner value by arrival
//	p{E(k)}:rw:qx      every intent, by expiry
//
// Sets and hashes live as long as their latest holder or intent, so none
// outlives its TTLs; [StateKeys] lists them all (fences and tombstones
// aside), for tests that look for leftovers. Fences outlive the lock they
// last served by [FenceGrace], tombstones their clean-up by one lease
// TTL: every key of a lock expires, and a key locked once leaves nothing
// once its TTL and the grace have passed.
//
// E is [EscapeTag]: it removes '{' and '}' from k injectively, so the braces
// we add are the hash tag Redis Cluster sees, whatever k contains. [Layout]
// builds the first two names, [DeadKey] the tombstone's. The scripts build
// the tombstone's name from the lock key themselves rather than take it
// among their KEYS, so that a request is no larger than one without it;
// Redis (Cluster included) lets a script touch undeclared keys in the slot
// of its declared ones, and the shared hash tag keeps it there.
//
// # Tombstones
//
// A request whose reply is lost may still run on the server, and it may
// run late: delayed on the network, it can reach Redis after the
// compare-and-delete its sender issued to clean up (on another
// connection). [Cleanup] therefore writes the value's tombstone in the
// same script as its compare-and-delete, and [Acquire] does not set the
// lock while its value's tombstone exists. Redis runs scripts one at a
// time, so whichever of the two runs second sees the first: a late acquire
// leaves nothing behind, as long as it arrives within one lease TTL (the
// tombstone's life) of its clean-up.
//
// # Fencing tokens
//
// Every script that grants a lock with a token starts with clock.lua, whose
// next_token(fence, ttl) returns max(last token + 1, the server's time in
// microseconds from TIME) and stores it in the fence key as the new last
// token, for the grant's TTL plus [FenceGrace]: a hybrid clock. Tokens
// increase strictly while the fence key lives; when it has expired (the
// grace after its lock), or is lost (a restart without persistence, a
// failover to a replica that missed the last grants, a dataset rolled
// back to an earlier snapshot) the next token is still larger than every
// earlier one, which were issued at earlier server times, unless the
// server's clock is behind the clock that issued them by more than the
// time that passed since (for an expired fence: at least the grace). A token is a count of microseconds since 1970 (or one more than
// the last token, when grants come faster than the clock ticks or the
// clock went back): below 2^53 until the year 2255, so it survives a trip
// through a JSON number.
//
// # Scripts
//
// [Acquire], [Release], [Cleanup] and [Extend] (mutexes), [SemAcquire],
// [RWAcquire], [GroupRelease], [GroupExtend], [GroupCleanup] and
// [RWWithdraw] (semaphores and read/write locks), [Withdraw] (the line
// of a mutex's or semaphore's waiters, queue.lua) and [Inspect] are
// [goredis.Script] values;
// the stores run them with [Run] (one call) or [Resend] (the calls of a
// pipeline), which send EVALSHA and fall back to EVAL when the server
// lacks the script ([NoScript]). Each script's file documents its KEYS,
// ARGV and reply; [DecodeAcquire] reads Acquire's reply.
package redisscript
