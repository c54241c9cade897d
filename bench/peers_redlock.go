package main

import (
	"context"

	goredis "github.com/redis/go-redis/v9"

	"github.com/distlock/distlock"
	"github.com/distlock/distlock/redlock"
)

func init() {
	register(&peer{
		name: "redlock-5", store: "redis",
		note:    "redlock.New over 5 independent nodes: the acquire script on every node at once, decided at a majority; no fencing token, no wake-up; WithSpin 10ms+[0,10ms)",
		renewal: "WithAutoRenew: a refresh per lock every TTL/3 on every node",
		open: func(ctx context.Context, s *servers, o openOpts) (instance, error) {
			return openRedlock(s, o)
		},
		counters: redisCounters(5),
	})
}

func openRedlock(s *servers, o openOpts) (instance, error) {
	addrs, err := s.redisAddrs(5)
	if err != nil {
		return nil, err
	}
	rc := &redisClients{}
	nodes := make([]goredis.UniversalClient, len(addrs))
	for i, a := range addrs {
		c := goredis.NewClient(&goredis.Options{Addr: a, ContextTimeoutEnabled: true})
		c.AddHook(countHook{own: &rc.sent})
		rc.cs = append(rc.cs, c)
		nodes[i] = c
	}
	res, err := redlock.New(nodes)
	if err != nil {
		_ = rc.close()
		return nil, err
	}
	return newDLInstance(res, o, rc, []distlock.Option{}, rc.close)
}
