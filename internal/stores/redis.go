package stores

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/distlock/distlock/backend"
	"github.com/distlock/distlock/redis"
	"github.com/distlock/distlock/redlock"
)

// redisStore is one Redis deployment: a server, a Sentinel group's master
// or a Cluster. Its client is made at parse time: go-redis connects only
// on the first command.
type redisStore struct {
	name   string
	client goredis.UniversalClient
	res    *redis.Resource
	ping   time.Duration // bounds the PING of Open: dial plus read timeout
}

// parseRedis parses a redis:// or rediss:// URL with the go-redis parser
// for kind: "" (one server), "sentinel" or "cluster".
func parseRedis(raw, kind string, so Options) (*redisStore, error) {
	// ContextTimeoutEnabled: the facade's bounds (the wait, the
	// validity a renewal must land in) become the requests' deadlines.
	// DialerRetries 1 (unless the URL sets it): a refused connection is
	// reported as one at once, within one attempt's bound, not after
	// go-redis's 1.7s of dials (see the redis package doc). NewClient
	// and its kin fill in the default timeouts.
	var c goredis.UniversalClient
	var dial, read time.Duration
	switch kind {
	case "":
		o, err := goredis.ParseURL(raw)
		if err != nil {
			return nil, err
		}
		o.ContextTimeoutEnabled = true
		o.DialerRetries = cmp.Or(o.DialerRetries, 1)
		c = goredis.NewClient(o)
		dial, read = o.DialTimeout, o.ReadTimeout
	case "sentinel":
		o, err := goredis.ParseFailoverURL(raw)
		if err != nil {
			return nil, err
		}
		if o.MasterName == "" {
			return nil, errors.New("a Sentinel URL needs ?master_name=NAME")
		}
		o.ContextTimeoutEnabled = true
		o.DialerRetries = cmp.Or(o.DialerRetries, 1)
		c = goredis.NewFailoverClient(o)
		dial, read = o.DialTimeout, o.ReadTimeout
	case "cluster":
		o, err := goredis.ParseClusterURL(raw)
		if err != nil {
			return nil, err
		}
		o.ContextTimeoutEnabled = true
		o.DialerRetries = cmp.Or(o.DialerRetries, 1)
		c = goredis.NewClusterClient(o)
		dial, read = o.DialTimeout, o.ReadTimeout
	}
	if so.RedisHook != nil {
		c.AddHook(so.RedisHook)
	}
	ping := max(dial, 0) + max(read, 0)
	if ping <= 0 {
		ping = 2 * defaultDialTimeout
	}
	name := Redact(raw)
	if kind != "" {
		scheme, rest, _ := strings.Cut(name, ":")
		name = scheme + "+" + kind + ":" + rest
	}
	var opts []redis.Option
	if so.PrefixSet {
		opts = append(opts, redis.WithPrefix(so.Prefix))
	}
	res, err := redis.New(c, append(opts, so.Redis...)...)
	if err != nil {
		_ = c.Close()
		return nil, err
	}
	return &redisStore{name: name, client: c, res: res, ping: ping}, nil
}

func (s *redisStore) String() string { return s.name }

func (s *redisStore) Holds(ttl time.Duration) string { return spinHolds(ttl) }

func (s *redisStore) ValidateKey(key string) error { return s.res.ValidateKey(key) }

func (s *redisStore) Proto() backend.RemoteResource { return s.res }

func (s *redisStore) Open(ctx context.Context, _ time.Duration) (backend.RemoteResource, func(), error) {
	closeAll := func() { s.client.Close() }
	// A PING, so that an unreachable server is reported now, whatever the
	// wait (go-redis bounds it by its dial and read timeouts).
	ctx, cancel := context.WithTimeout(ctx, s.ping)
	defer cancel()
	if err := s.client.Ping(ctx).Err(); err != nil {
		s.res.Close()
		closeAll()
		return nil, nil, err
	}
	return s.res, closeAll, nil
}

// redlockStore is Redlock over independent Redis servers.
type redlockStore struct {
	name    string
	clients []goredis.UniversalClient
	res     *redlock.Resource
}

// parseRedlock parses the comma-separated Redis URLs after "redlock:".
func parseRedlock(list string, so Options) (*redlockStore, error) {
	if !strings.HasPrefix(list, "redis") {
		return nil, errors.New("want redlock:redis://HOST1:PORT,redis://HOST2:PORT,redis://HOST3:PORT")
	}
	s := &redlockStore{}
	var names []string
	for _, raw := range strings.Split(list, ",") {
		o, err := goredis.ParseURL(raw)
		if err != nil {
			s.close()
			return nil, fmt.Errorf("node %q: %w", Redact(raw), err)
		}
		o.ContextTimeoutEnabled = true               // per-node timeouts, as redlock's doc asks
		o.DialerRetries = cmp.Or(o.DialerRetries, 1) // a refused node is reported as one (redlock's doc)
		c := goredis.NewClient(o)
		if so.RedisHook != nil {
			c.AddHook(so.RedisHook)
		}
		s.clients = append(s.clients, c)
		names = append(names, Redact(raw))
	}
	var opts []redlock.Option
	if so.PrefixSet {
		opts = append(opts, redlock.WithPrefix(so.Prefix))
	}
	res, err := redlock.New(s.clients, append(opts, so.Redlock...)...)
	if err != nil {
		s.close()
		return nil, err
	}
	s.res, s.name = res, "redlock:"+strings.Join(names, ",")
	return s, nil
}

// close closes the Resource and the clients, when Open is never called.
func (s *redlockStore) close() {
	if s.res != nil {
		s.res.Close()
	}
	s.closeClients()
}

func (s *redlockStore) closeClients() {
	for _, c := range s.clients {
		c.Close()
	}
}

func (s *redlockStore) String() string { return s.name }

func (s *redlockStore) Holds(ttl time.Duration) string {
	return spinHolds(ttl) + ", on a majority of the nodes"
}

func (s *redlockStore) ValidateKey(key string) error { return s.res.ValidateKey(key) }

func (s *redlockStore) Proto() backend.RemoteResource { return s.res }

func (s *redlockStore) Open(context.Context, time.Duration) (backend.RemoteResource, func(), error) {
	return s.res, s.closeClients, nil
}
