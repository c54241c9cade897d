package main

import (
	"bufio"
	"context"
	"fmt"
	"strconv"
	"strings"

	goredis "github.com/redis/go-redis/v9"

	"github.com/distlock/distlock/backend"
	"github.com/distlock/distlock/redis"
)

func init() {
	openers["redis"] = func(ctx context.Context, a addrs) (store, error) {
		admin := goredis.NewClient(&goredis.Options{Addr: a.redis})
		if err := admin.Ping(ctx).Err(); err != nil {
			admin.Close()
			return nil, fmt.Errorf("ping %s: %w", a.redis, err)
		}
		return &redisStore{addr: a.redis, admin: admin}, nil
	}
}

// redisStore is one Redis server; each instance gets its own client (its
// own connection pool), as a separate process would.
type redisStore struct {
	addr  string
	admin *goredis.Client // reads INFO commandstats
}

func (s *redisStore) resource(_ context.Context, notify bool) (backend.RemoteResource, func() error, error) {
	c := goredis.NewClient(&goredis.Options{Addr: s.addr})
	res, err := redis.New(c)
	if err != nil {
		_ = c.Close()
		return nil, nil, err
	}
	closeAll := func() error { res.Close(); return c.Close() }
	if !notify {
		return spinOnly{res}, closeAll, nil
	}
	return res, closeAll, nil
}

func (s *redisStore) commands(ctx context.Context) (map[string]uint64, error) {
	return commandStats(ctx, s.admin)
}

func (s *redisStore) close() error { return s.admin.Close() }

// commandStats returns the calls of SET and of the script commands from
// INFO commandstats. Commands a script runs are counted there too.
func commandStats(ctx context.Context, c *goredis.Client) (map[string]uint64, error) {
	info, err := c.Info(ctx, "commandstats").Result()
	if err != nil {
		return nil, fmt.Errorf("INFO commandstats: %w", err)
	}
	out := map[string]uint64{"SET": 0, "scripts": 0}
	sc := bufio.NewScanner(strings.NewReader(info))
	for sc.Scan() {
		// cmdstat_set:calls=123,usec=...
		name, rest, ok := strings.Cut(strings.TrimSpace(sc.Text()), ":")
		if !ok || !strings.HasPrefix(name, "cmdstat_") {
			continue
		}
		calls, _, _ := strings.Cut(strings.TrimPrefix(rest, "calls="), ",")
		n, err := strconv.ParseUint(calls, 10, 64)
		if err != nil {
			continue
		}
		switch strings.TrimPrefix(name, "cmdstat_") {
		case "set":
			out["SET"] += n
		case "eval", "evalsha", "eval_ro", "evalsha_ro", "fcall", "fcall_ro":
			out["scripts"] += n
		}
	}
	return out, sc.Err()
}
