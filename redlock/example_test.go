package redlock_test

import (
	"context"
	"errors"
	"log"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/distlock/distlock"
	"github.com/distlock/distlock/redlock"
)

// A lock over five independent Redis masters. (Not run: it needs the
// servers.)
func Example() {
	var nodes []goredis.UniversalClient
	for _, addr := range []string{"redis-a:6379", "redis-b:6379", "redis-c:6379", "redis-d:6379", "redis-e:6379"} {
		// ContextTimeoutEnabled lets go-redis give up a slow node's I/O at
		// the per-node timeout.
		c := goredis.NewClient(&goredis.Options{Addr: addr, ContextTimeoutEnabled: true})
		defer c.Close()
		nodes = append(nodes, c)
	}
	res, err := redlock.New(nodes)
	if err != nil {
		log.Fatal(err)
	}
	d, err := distlock.New(res, distlock.WithDefaultTTL(10*time.Second))
	if err != nil {
		log.Fatal(err)
	}
	defer d.Close()

	ctx := context.Background()
	lk, err := d.TryLock(ctx, "report:daily", 5*time.Second)
	switch {
	case errors.Is(err, distlock.ErrNotAcquired):
		return // another process builds the report
	case errors.Is(err, redlock.ErrNoQuorum):
		log.Fatal(err) // fewer than 3 of the 5 nodes answered
	case err != nil:
		log.Fatal(err)
	}
	defer lk.Unlock(ctx)
	// lk.Token() is 0: Redlock makes no fencing tokens. Build the report
	// within the lock's validity, and make it harmless to build twice.
}
