package redisscript

// DefaultPrefix is the key prefix of the Redis stores (redis and
// redlock) unless their WithPrefix says otherwise, so a lock key is named
// alike on both.
const DefaultPrefix = "distlock:"

// MaxKeyLen is the longest lock key, in bytes, the Redis stores accept.
// Redis itself takes keys up to 512 MB; a lock name is short, and a
// longer one is almost surely a mistake (a payload passed as a key).
const MaxKeyLen = 64 << 10
