package main

import (
	"context"
	"errors"
	"fmt"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/distlock/distlock"
)

// The Redis floors of the kinds workloads: bare go-redis and one Lua
// script per attempt over sorted sets scored by expiry on the server's
// clock, polled every cfg.retry; no token, no limit check, no wake-up, no
// clean-up of an attempt whose reply was lost. Keys share a hash tag, as
// on Cluster.
func init() {
	registerKindsFloor(wlSemaphore, &kindsPeer{
		name: "floor", store: "redis", ref: true,
		note:     "bare go-redis: a script per attempt (TIME, ZREMRANGEBYSCORE of the expired holders, ZCARD < limit, ZADD with the expiry, PEXPIRE), ZREM to release; retry every 10ms",
		open:     openRedisKindsFloor,
		counters: redisCounters(1),
	})
	registerKindsFloor(wlReadMostly, &kindsPeer{
		name: "floor", store: "redis", ref: true,
		note:     "bare go-redis, writer-preferring: a reader's script holds when no writer holds and no writer waits (ZADD to the readers' sorted set); a writer's when nobody holds (SET PX), else it records its intent in a sorted set that keeps new readers out; ZREM / compare-and-delete to release, ZREM of the intent when a writer gives up; retry every 10ms",
		open:     openRedisKindsFloor,
		counters: redisCounters(1),
	})
}

// floorNow is the server's clock in milliseconds, in a script.
const floorNow = `local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
`

var (
	// KEYS: holders. ARGV: owner, TTL ms, limit.
	floorSemAcquire = goredis.NewScript(floorNow + `redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
if redis.call('ZCARD', KEYS[1]) < tonumber(ARGV[3]) then
  redis.call('ZADD', KEYS[1], now + tonumber(ARGV[2]), ARGV[1])
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return 1
end
return 0`)
	// KEYS: readers, writer, writers' intents. ARGV: owner, TTL ms.
	floorReadAcquire = goredis.NewScript(floorNow + `if redis.call('EXISTS', KEYS[2]) == 1 then return 0 end
redis.call('ZREMRANGEBYSCORE', KEYS[3], '-inf', now)
if redis.call('ZCARD', KEYS[3]) > 0 then return 0 end
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
redis.call('ZADD', KEYS[1], now + tonumber(ARGV[2]), ARGV[1])
redis.call('PEXPIRE', KEYS[1], ARGV[2])
return 1`)
	floorWriteAcquire = goredis.NewScript(floorNow + `redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
if redis.call('EXISTS', KEYS[2]) == 0 and redis.call('ZCARD', KEYS[1]) == 0 then
  redis.call('SET', KEYS[2], ARGV[1], 'PX', ARGV[2])
  redis.call('ZREM', KEYS[3], ARGV[1])
  return 1
end
redis.call('ZADD', KEYS[3], now + tonumber(ARGV[2]), ARGV[1])
redis.call('PEXPIRE', KEYS[3], ARGV[2])
return 0`)
	// KEYS: writer. ARGV: owner.
	floorWriteRelease = goredis.NewScript(`if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0`)
)

// redisKindsFloor is the bare floor (client, TTL, values) with the kinds'
// scripts.
type redisKindsFloor struct{ *redisFloor }

var _ kindsInstance = redisKindsFloor{}

func openRedisKindsFloor(_ context.Context, s *servers, o openOpts, _ string) (kindsInstance, error) {
	f, err := newRedisFloor(s, o)
	if err != nil {
		return nil, err
	}
	return redisKindsFloor{f}, nil
}

// floorKeys are the keys of key's semaphore (the holders) or read/write
// lock (readers, writer, writers' intents), in one hash slot.
func floorKeys(key string, kind distlock.Kind) []string {
	tag := "bare{" + key + "}"
	if kind == distlock.KindSemaphore {
		return []string{tag + ":sem"}
	}
	return []string{tag + ":r", tag + ":w", tag + ":i"}
}

func (f redisKindsFloor) acquireKind(ctx context.Context, key string, kind distlock.Kind, limit int, wait time.Duration) (held, error) {
	v, ms := f.value(), f.ttl.Milliseconds()
	keys := floorKeys(key, kind)
	var (
		script *goredis.Script
		args   []any
	)
	switch kind {
	case distlock.KindSemaphore:
		script, args = floorSemAcquire, []any{v, ms, limit}
	case distlock.KindRead:
		script, args = floorReadAcquire, []any{v, ms}
	case distlock.KindWrite:
		script, args = floorWriteAcquire, []any{v, ms}
	default:
		return nil, fmt.Errorf("floor: kind %v", kind)
	}
	err := pollFloor(ctx, wait, f.retry, func() (bool, error) {
		n, err := script.Run(ctx, f.c, keys, args...).Int()
		return n == 1, err
	})
	if err == nil {
		return &redisKindsHeld{f: f, kind: kind, keys: keys, val: v}, nil
	}
	if errors.Is(err, errNotAcquired) && kind == distlock.KindWrite { // give up: the intent goes
		if err := f.c.ZRem(ctx, keys[2], v).Err(); err != nil {
			return nil, err
		}
	}
	return nil, err
}

// redisKindsHeld is what a user of the floor keeps: the keys and value.
type redisKindsHeld struct {
	f    redisKindsFloor
	kind distlock.Kind
	keys []string
	val  string
}

func (h *redisKindsHeld) unlock(ctx context.Context) error {
	var (
		n   int64
		err error
	)
	if h.kind == distlock.KindWrite {
		n, err = floorWriteRelease.Run(ctx, h.f.c, h.keys[1:2], h.val).Int64()
	} else {
		n, err = h.f.c.ZRem(ctx, h.keys[0], h.val).Result()
	}
	if err == nil && n != 1 {
		err = errors.New("floor: not held at release")
	}
	return err
}
