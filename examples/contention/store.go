package main

import (
	"bufio"
	"context"
	"fmt"
	"strconv"
	"strings"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/distlock/distlock/backend"
	"github.com/distlock/distlock/backend/memory"
	"github.com/distlock/distlock/internal/stores"
)

// store is the store under test; each instance gets its own resource
// from it, with clients of its own, as a separate process would.
type store interface {
	// resource returns the resource of one instance (one "process"), and
	// a function closing what it opened. Without notify, the store's
	// release notices are hidden (the waiters spin).
	resource(ctx context.Context, notify bool) (backend.RemoteResource, func() error, error)
	// commands returns the store's command counters by name, or nil when
	// the store has none to report.
	commands(ctx context.Context) (map[string]uint64, error)
	close() error
}

// openStore opens c.store: the memory store, or a URL internal/stores
// opens (the distlock command's syntax) once per instance; for Redis, a
// client of its own reads the server's command counters.
func openStore(ctx context.Context, c config) (store, error) {
	if c.store == "memory" {
		return &memoryStore{s: memory.New()}, nil
	}
	u := &urlStore{raw: c.store, ttl: c.ttl}
	if strings.HasPrefix(c.store, "redis://") || strings.HasPrefix(c.store, "rediss://") {
		o, err := goredis.ParseURL(c.store)
		if err != nil {
			return nil, err
		}
		u.admin = goredis.NewClient(o)
		if err := u.admin.Ping(ctx).Err(); err != nil {
			u.admin.Close()
			return nil, fmt.Errorf("ping %s: %w", stores.Redact(c.store), err)
		}
	}
	return u, nil
}

// storeLabel names the store in the output: "memory", or the URL's scheme.
func storeLabel(raw string) string {
	scheme, _, _ := strings.Cut(raw, ":")
	return scheme
}

// hideNotices hides a store's release notices (and everything but
// acquire and release) when notify is off; a store that does not spin has
// none to hide.
func hideNotices(res backend.RemoteResource, notify bool) backend.RemoteResource {
	if sp, ok := res.(backend.Spinner); ok && !notify {
		return spinOnly{sp}
	}
	return res
}

// memoryStore is one in-process store shared by all instances, as one
// server is shared by several processes.
type memoryStore struct{ s *memory.Store }

func (m *memoryStore) resource(_ context.Context, notify bool) (backend.RemoteResource, func() error, error) {
	return hideNotices(m.s, notify), func() error { return nil }, nil
}

func (m *memoryStore) commands(context.Context) (map[string]uint64, error) { return nil, nil }

func (m *memoryStore) close() error { return nil }

// urlStore is a store internal/stores opens from its URL.
type urlStore struct {
	raw   string
	ttl   time.Duration   // sizes a ZooKeeper session
	admin *goredis.Client // Redis: reads INFO commandstats; nil for other stores
}

func (s *urlStore) resource(ctx context.Context, notify bool) (backend.RemoteResource, func() error, error) {
	res, closeClients, err := stores.Open(ctx, s.raw, s.ttl, stores.Options{})
	if err != nil {
		return nil, nil, err
	}
	// The DistributeLock closes the resource; this closes its clients.
	return hideNotices(res, notify), func() error { closeClients(); return nil }, nil
}

func (s *urlStore) commands(ctx context.Context) (map[string]uint64, error) {
	if s.admin == nil {
		return nil, nil
	}
	return commandStats(ctx, s.admin)
}

func (s *urlStore) close() error {
	if s.admin != nil {
		return s.admin.Close()
	}
	return nil
}

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
