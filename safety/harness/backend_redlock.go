package harness

import (
	"context"

	goredis "github.com/redis/go-redis/v9"

	"github.com/distlock/distlock/backend"
	"github.com/distlock/distlock/redlock"
)

func init() {
	extraOpeners["redlock"] = func(ctx context.Context, b Backend) (backend.RemoteResource, func(), error) {
		var nodes []goredis.UniversalClient
		closeAll := func() {
			for _, n := range nodes {
				_ = n.Close()
			}
		}
		for _, a := range b.Addrs {
			nodes = append(nodes, goredis.NewClient(&goredis.Options{
				Addr: a, DialTimeout: b.timeout(), ReadTimeout: b.timeout(), WriteTimeout: b.timeout(),
				ContextTimeoutEnabled: true, MaxRetries: -1,
			}))
		}
		r, err := redlock.New(nodes)
		if err != nil {
			closeAll()
			return nil, nil, err
		}
		return r, func() { _ = r.Close(); closeAll() }, nil
	}
}
