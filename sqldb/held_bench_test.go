package sqldb

import (
	"context"
	"flag"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/distlock/distlock"
)

var heldLocks = flag.Int("held-locks", 10000, "BenchmarkMariaDBHeld: locks held at once")

// BenchmarkMariaDBHeld holds -held-locks locks at once in one process with
// WithAutoRenew (TTL 6s: renewals every 2s, batched by the facade's
// scheduler into RefreshAll) and counts, by the server's Questions
// status, the statements the process sends per second while it merely
// holds them (the bench program has no MySQL peer). It reports them and
// the locks lost. The target: at most one statement per 500 locks
// per renewal interval, so 100,000 locks: 100 per second.
//
//	go test -run '^$' -bench BenchmarkMariaDBHeld -benchtime 1x -held-locks 100000 ./sqldb/
func BenchmarkMariaDBHeld(b *testing.B) {
	my := newMy(b)
	ctx := context.Background()
	db := my.db(b, nil)
	db.SetMaxOpenConns(32)
	db.SetMaxIdleConns(32) // no connection churn: each new one re-prepares the statements
	res := my.resource(b, db)
	const ttl = 6 * time.Second
	d, err := distlock.New(res, distlock.WithAutoRenew(), distlock.WithDefaultTTL(ttl))
	if err != nil {
		b.Fatal(err)
	}
	defer d.Close()
	status := func(v string) int64 {
		var name string
		var n int64
		if err := my.admin.QueryRowContext(ctx, "SHOW GLOBAL STATUS LIKE '"+v+"'").Scan(&name, &n); err != nil {
			b.Fatal(err)
		}
		return n
	}
	questions := func() int64 { return status("Questions") }
	for b.Loop() {
		n := *heldLocks
		locks := make([]*distlock.Lock, n)
		var next atomic.Int64
		var wg sync.WaitGroup
		start := time.Now()
		for range 32 {
			wg.Go(func() {
				for i := next.Add(1) - 1; i < int64(n); i = next.Add(1) - 1 {
					lk, err := d.TryLock(ctx, fmt.Sprintf("held-%d-%d", start.UnixNano(), i), 10*time.Second)
					if err != nil {
						b.Error(err)
						return
					}
					locks[i] = lk
				}
			})
		}
		wg.Wait()
		acquired := time.Since(start)
		u0, s0 := status("Com_update_multi"), status("Com_select")
		q0, t0 := questions(), time.Now()
		time.Sleep(3 * ttl / 2) // three renewal intervals
		q1 := questions()
		b.Logf("multi-table UPDATEs %d, SELECTs %d (less 3 SHOWs)", status("Com_update_multi")-u0, status("Com_select")-s0)
		perSec := float64(q1-q0-1) / time.Since(t0).Seconds() // less the SHOW itself
		var lost atomic.Int64
		next.Store(0)
		for range 32 {
			wg.Go(func() {
				for i := next.Add(1) - 1; i < int64(n); i = next.Add(1) - 1 {
					if locks[i] == nil {
						continue
					}
					if err := locks[i].Unlock(ctx); err != nil {
						lost.Add(1)
					}
				}
			})
		}
		wg.Wait()
		b.ReportMetric(perSec, "stmts/s-held")
		b.ReportMetric(perSec*(ttl/3).Seconds()/float64(n)*500, "stmts/500-locks/interval")
		b.ReportMetric(float64(lost.Load()), "lost")
		b.Logf("%d locks acquired in %v; %.1f statements/s while held; %d lost at release", n, acquired.Round(time.Millisecond), perSec, lost.Load())
	}
}
