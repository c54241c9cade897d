package redis

import (
	"context"
	_ "embed"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/distlock/distlock/backend"
	"github.com/distlock/distlock/fence"
	"github.com/distlock/distlock/internal/redisscript"
)

//go:embed fence.lua
var fenceSrc string

// Fence writes Redis keys guarded by fencing tokens: each write is one
// Lua script that refuses a token below the highest one accepted for the
// key, and otherwise records it and writes, with nothing in between. The
// resource is the key: its tokens are its own, and one lock key must
// fence it (tokens of different locks do not compare).
//
// The highest token of key lives in the fence key "{tag}:fence:" + key,
// where tag is key's hash tag, or key itself when it has none: both keys
// hash to one Redis Cluster slot (and one Ring shard). A fence key never
// expires, and [Fence.Del] keeps it, so that a stale holder cannot bring
// a deleted key back: delete it yourself, with the key, when the resource
// is gone for good. A key without a hash tag must not contain '}' (its
// fence key could not share its slot).
//
// Every method refuses a stale token with a *fence.StaleError
// (errors.Is(err, fence.ErrStale)), writing nothing; an equal token
// passes. Bad input is an error wrapping distlock.ErrInvalid, before any
// I/O: a nil context (or a Fence not made by [NewFence]), an empty key or one over [MaxKeyLen]
// bytes, a key with '}' but no hash tag, token 0, a negative TTL, more
// keys of another slot than the key's. Reads need no fence: use the
// client. A Fence is safe for concurrent use.
type Fence struct {
	c goredis.Scripter
}

var _ fence.Guard = (*Fence)(nil)

// NewFence returns a Fence writing through c: a *goredis.Client,
// *goredis.ClusterClient or *goredis.Ring (its shards follow hash tags).
// The caller owns c. NewFence does no I/O; a nil c is an error wrapping
// [backend.ErrInvalid] (distlock.ErrInvalid).
func NewFence(c goredis.Scripter) (*Fence, error) {
	if u, ok := c.(goredis.UniversalClient); c == nil || ok && isNil(u) {
		return nil, fmt.Errorf("redis: NewFence: %w: nil client", backend.ErrInvalid)
	}
	return &Fence{c: c}, nil
}

// FencedScript is a Lua script of your own that runs only when its token
// passes the fence of its key: [Fence.Run] runs it with that key as
// KEYS[1], the keys given as KEYS[2..] and the arguments as ARGV, exactly
// as EVAL would, after the check. The script must not write keys of
// another slot than its key's, and must not return an error starting
// with "STALE ", which Run reads as the fence's refusal. If the script
// fails after a write, the writes before it stay, as with any Redis
// script; so does the token, which only makes older holders refused.
type FencedScript struct {
	s *goredis.Script
}

// NewFencedScript returns src, the body of a script, wrapped in the check.
func NewFencedScript(src string) *FencedScript {
	return &FencedScript{s: goredis.NewScript(fenceSrc +
		"local function fenced(KEYS, ARGV)\n" + src + "\nend\nreturn fenced(fence_keys, fence_argv)\n")}
}

var (
	fenceCheckScript = NewFencedScript(`return 1`)
	fenceSetScript   = NewFencedScript(`if ARGV[2] == '0' then
  return redis.call('SET', KEYS[1], ARGV[1])
end
return redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])`)
	fenceDelScript  = NewFencedScript(`return redis.call('DEL', KEYS[1])`)
	fenceHSetScript = NewFencedScript(`return redis.call('HSET', KEYS[1], ARGV[1], ARGV[2])`)
)

// Check records token as key's highest if it is not below it, and writes
// nothing else ([fence.Guard]): for [fence.Middleware], or to fence a key
// before writes of your own that need no atomicity with it.
func (f *Fence) Check(ctx context.Context, key string, token uint64) error {
	return f.do(ctx, "check", fenceCheckScript, key, token)
}

// Set sets key to value, expiring after ttl (rounded up to a millisecond;
// 0: no expiry), if token passes key's fence. value is encoded as
// go-redis encodes command arguments.
func (f *Fence) Set(ctx context.Context, key string, token uint64, value any, ttl time.Duration) error {
	if ttl < 0 {
		return fmt.Errorf("redis: fence: set %s with a negative TTL %v: %w", shortKey(key), ttl, backend.ErrInvalid)
	}
	ms := int64(0)
	if ttl > 0 {
		ms = redisscript.Millis(ttl)
	}
	return f.do(ctx, "set", fenceSetScript, key, token, value, ms)
}

// Del deletes key, if token passes its fence. The fence stays.
func (f *Fence) Del(ctx context.Context, key string, token uint64) error {
	return f.do(ctx, "del", fenceDelScript, key, token)
}

// HSet sets field of the hash key to value, if token passes key's fence:
// the fence guards the whole hash.
func (f *Fence) HSet(ctx context.Context, key string, token uint64, field string, value any) error {
	return f.do(ctx, "hset", fenceHSetScript, key, token, field, value)
}

// do runs one of the methods' scripts and keeps only its error.
func (f *Fence) do(ctx context.Context, op string, s *FencedScript, key string, token uint64, args ...any) error {
	err := f.Run(ctx, s, key, token, nil, args...).Err()
	var stale *fence.StaleError
	if err == nil || errors.As(err, &stale) || errors.Is(err, backend.ErrInvalid) {
		return err
	}
	return fmt.Errorf("redis: fence: %s %s: %w", op, shortKey(key), err)
}

// Run runs s with KEYS = key, keys... and ARGV = args, if token passes
// key's fence, and returns its reply as go-redis's Script.Run does; its
// Err is a *fence.StaleError when the token was refused (nothing ran),
// an error wrapping distlock.ErrInvalid for bad input (no I/O), and
// otherwise as go-redis gives it.
func (f *Fence) Run(ctx context.Context, s *FencedScript, key string, token uint64, keys []string, args ...any) *goredis.Cmd {
	fk, err := f.validate(ctx, s, key, token, keys)
	if err != nil {
		cmd := goredis.NewCmd(context.Background())
		cmd.SetErr(err)
		return cmd
	}
	allKeys := make([]string, 0, 2+len(keys))
	allKeys = append(append(allKeys, fk, key), keys...)
	argv := make([]any, 0, 1+len(args))
	argv = append(append(argv, strconv.FormatUint(token, 10)), args...)
	cmd := s.s.Run(ctx, f.c, allKeys, argv...)
	if err := cmd.Err(); err != nil {
		if msg, ok := strings.CutPrefix(err.Error(), "STALE "); ok {
			if highest, perr := strconv.ParseUint(msg, 10, 64); perr == nil {
				cmd.SetVal(nil)
				cmd.SetErr(&fence.StaleError{Resource: key, Token: token, Highest: highest})
			}
		}
	}
	return cmd
}

// validate checks Run's input and returns key's fence key.
func (f *Fence) validate(ctx context.Context, s *FencedScript, key string, token uint64, keys []string) (string, error) {
	if err := fence.Validate(key, token); err != nil {
		return "", err
	}
	switch {
	case f == nil || f.c == nil || ctx == nil || s == nil:
		return "", fmt.Errorf("redis: fence: %s: a nil context or script, or a Fence not made by NewFence: %w", shortKey(key), backend.ErrInvalid)
	case len(key) > MaxKeyLen:
		return "", fmt.Errorf("redis: fence: key %s is %d bytes long; at most %d: %w", shortKey(key), len(key), MaxKeyLen, backend.ErrInvalid)
	}
	fk, err := fenceKey(key)
	if err != nil {
		return "", err
	}
	slot := redisscript.Slot(key)
	for _, k := range keys {
		if redisscript.Slot(k) != slot {
			return "", fmt.Errorf("redis: fence: %s: key %s hashes to another Cluster slot (give both one hash tag): %w",
				shortKey(key), shortKey(k), backend.ErrInvalid)
		}
	}
	return fk, nil
}

// fenceKey returns the key holding key's highest token: "{tag}:fence:"
// and key, where tag is key's hash tag (the bytes between its first '{'
// and the first '}' after it, when not empty), or else key itself, which
// must then have no '}'. Both hash to one slot, and no two keys share a
// fence key: the first '}' of the fence key ends the tag, and key follows
// ":fence:" after it.
func fenceKey(key string) (string, error) {
	tag := key
	if s := strings.IndexByte(key, '{'); s >= 0 {
		if e := strings.IndexByte(key[s+1:], '}'); e > 0 {
			tag = key[s+1 : s+1+e]
		}
	}
	if tag == key && strings.IndexByte(key, '}') >= 0 {
		return "", fmt.Errorf("redis: fence: key %s has a '}' but no hash tag: its fence key could not share its Cluster slot (give it a tag, {...}): %w",
			shortKey(key), backend.ErrInvalid)
	}
	return "{" + tag + "}:fence:" + key, nil
}

// shortKey quotes a key for an error message, eliding the middle of a
// long one.
func shortKey(k string) string {
	if len(k) <= 40 {
		return strconv.Quote(k)
	}
	return strconv.Quote(k[:40]) + "..."
}
