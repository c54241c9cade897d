package redis_test

import (
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/distlock/distlock"
	"github.com/distlock/distlock/internal/testserver"
	"github.com/distlock/distlock/testsuite"
)

// BenchmarkContended is the seed workload's shape: 3 instances (each a
// DistributeLock over a client of its own, as processes would have) x 4
// goroutines take one key in turn, with release notices. One op is one
// successful TryLock + Unlock; cmds/op counts the scripts sent (acquire
// attempts and releases) per op. bench/ compares this with the peers.
func BenchmarkContended(b *testing.B) {
	srv := testserver.Redis(b)
	admin := goredis.NewClient(&goredis.Options{Addr: srv.Addr})
	b.Cleanup(func() { _ = admin.Close() })
	var ds []*distlock.DistributeLock
	for range 3 {
		c := goredis.NewClient(&goredis.Options{Addr: srv.Addr})
		b.Cleanup(func() { _ = c.Close() })
		d, err := distlock.New(mustNew(b, c), distlock.WithDefaultTTL(10*time.Second))
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { _ = d.Close() })
		ds = append(ds, d)
	}
	key := uniqueKey(b)
	before := commandStats(b, admin)
	testsuite.Contend(b, ds, key, 12)
	reportCommands(b, admin, before, "evalsha", "eval")
}
