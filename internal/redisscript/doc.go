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
//	p{E(k)}:fence  the fence counter: INCR'd on every acquisition, never expires
//	p{E(k)}        also the name of the release notice channel (channels and
//	               keys are separate namespaces)
//
// E is [EscapeTag]: it removes '{' and '}' from k injectively, so the braces
// we add are the hash tag Redis Cluster sees, whatever k contains. [Layout]
// builds both names.
//
// # Scripts
//
// [Acquire], [Release] and [Extend] are [goredis.Script] values; run them with
// Script.Run, which tries EVALSHA and falls back to EVAL once per server that
// lacks the script. Each script's file documents its KEYS, ARGV and reply;
// [DecodeAcquire] reads Acquire's reply.
package redisscript
