package main

import (
	"context"
	"strings"

	"github.com/distlock/distlock/internal/stores"
)

func init() {
	register(&peer{
		name: "redlock-5", store: "redis",
		note:    "redlock.New over 5 independent nodes: the acquire script on every node at once, decided at a majority; no fencing token, no wake-up; WithSpin 10ms+[0,10ms)",
		renewal: "WithAutoRenew: a refresh per lock every TTL/3 on every node",
		open: func(ctx context.Context, s *servers, o openOpts) (instance, error) {
			return openRedlock(ctx, s, o)
		},
		counters: redisCounters(5),
	})
}

func openRedlock(ctx context.Context, s *servers, o openOpts) (instance, error) {
	addrs, err := s.redisAddrs(5)
	if err != nil {
		return nil, err
	}
	nodes := make([]string, len(addrs))
	for i, a := range addrs {
		nodes[i] = "redis://" + a
	}
	rc := &redisClients{}
	return openDistlock(ctx, "redlock:"+strings.Join(nodes, ","), o, rc, stores.Options{RedisHook: countHook{own: &rc.sent}})
}
