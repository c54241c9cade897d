package safety

import (
	"context"
	"sync"
	"testing"

	"github.com/distlock/distlock/safety/harness"
	"github.com/distlock/distlock/safety/history"
)

// redisRegister is the fenced resource of the tests that hold locks in
// their own process: a Redis key written through redis.Fence (see
// harness.Fence), each write recorded as the store saw it (its order and
// verdict), for history.StaleWrites.
type redisRegister struct {
	w        *harness.FenceWriter
	resource string

	mu       sync.Mutex
	evs      []history.Event
	accepted int
	refused  int
}

// newRedisRegister writes resource's register on the Redis at addr.
func newRedisRegister(t testing.TB, addr, resource string) *redisRegister {
	t.Helper()
	w, err := harness.OpenFence(context.Background(), harness.Fence{Kind: "redis", Addr: addr})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = w.Close() })
	return &redisRegister{w: w, resource: resource}
}

// write writes as owner with token and reports whether the fence
// accepted it.
func (g *redisRegister) write(ctx context.Context, owner string, token uint64) (bool, error) {
	ev, err := g.w.Write(ctx, g.resource, owner, token)
	if err != nil {
		return false, err
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	g.evs = append(g.evs, ev)
	if ev.Accepted {
		g.accepted++
	} else {
		g.refused++
	}
	return ev.Accepted, nil
}

// stale returns the stale writes the register accepted, judged against
// the acquisitions in acqs.
func (g *redisRegister) stale(acqs []history.Event) []history.StaleWrite {
	g.mu.Lock()
	defer g.mu.Unlock()
	return history.StaleWrites(append(append([]history.Event(nil), acqs...), g.evs...))
}
