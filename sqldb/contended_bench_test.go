package sqldb

import (
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/distlock/distlock"
	"github.com/distlock/distlock/testsuite"
)

// BenchmarkPostgresContended is the seed workload's shape: 3 instances
// (each a DistributeLock over a pool of its own, as processes would have)
// x 4 goroutines take one key in turn, woken by LISTEN/NOTIFY. One op is
// one successful TryLock + Unlock; stmts/op counts the statements sent
// (acquire attempts and releases) per op.
func BenchmarkPostgresContended(b *testing.B) {
	pg := newPG(b)
	sc := &stmtCounter{}
	var ds []*distlock.DistributeLock
	for range 3 {
		res := pg.resource(b, pg.pool(b, func(c *pgxpool.Config) { c.ConnConfig.Tracer = sc }))
		d, err := distlock.New(res, distlock.WithDefaultTTL(10*time.Second))
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { _ = d.Close() })
		ds = append(ds, d)
	}
	key := "contended"
	sc.n.Store(0)
	testsuite.Contend(b, ds, key, 12)
	b.ReportMetric(float64(sc.n.Load())/float64(b.N), "stmts/op")
}
