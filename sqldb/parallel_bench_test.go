package sqldb

import (
	"context"
	"database/sql"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/distlock/distlock/backend"
)

// BenchmarkMariaDBParallelKeys asks whether MySQL's one fencing counter row
// serializes acquires of different keys: p goroutines, each locking and
// unlocking a key of its own (no contention for any lock), share one
// *sql.DB. "distlock" runs the backend's statements (every acquire bumps
// the counter row and holds its row lock until it commits); "floor" runs
// a single-row upsert and delete with an AUTO_INCREMENT token, which takes
// no row lock shared across keys. Each reports row-lock-waits/op and
// row-lock-ms/op from InnoDB's status counters: acquires that had to wait
// for another's row lock, and how long. Compare ns/op across p: if the
// counter row serialized, distlock would stop scaling where the floor
// goes on.
//
//	go test -run '^$' -bench BenchmarkMariaDBParallelKeys -count 5 ./sqldb/
func BenchmarkMariaDBParallelKeys(b *testing.B) {
	my := newMy(b)
	ctx := context.Background()
	var runs atomic.Int64
	for _, p := range []int{1, 4, 16, 64} {
		b.Run(fmt.Sprintf("p=%d/distlock", p), func(b *testing.B) {
			db := my.db(b, nil)
			r := my.resource(b, db)
			runParallelKeys(b, my.admin, p, &runs, func(key string, i int) {
				l := &backend.Lease{Key: key, Value: fmt.Sprintf("owner-%s-%d", key, i), TTL: 10 * time.Second}
				ok, _, err := r.TryAcquire(ctx, l)
				if err != nil || !ok {
					b.Errorf("TryAcquire(%q) = %v, %v", key, ok, err)
					return
				}
				if err := r.Release(ctx, l); err != nil {
					b.Errorf("Release(%q): %v", key, err)
				}
			})
		})
		b.Run(fmt.Sprintf("p=%d/floor", p), func(b *testing.B) {
			db := my.db(b, nil)
			if _, err := db.ExecContext(ctx, `CREATE TABLE IF NOT EXISTS bare_locks (
  lock_key VARBINARY(255) NOT NULL PRIMARY KEY, owner VARBINARY(255) NOT NULL,
  token BIGINT UNSIGNED NOT NULL AUTO_INCREMENT UNIQUE, expires_at DATETIME(6) NOT NULL) ENGINE=InnoDB`); err != nil {
				b.Fatal(err)
			}
			up := mustPrepare(b, db, `INSERT INTO bare_locks (lock_key, owner, expires_at)
VALUES (?, ?, UTC_TIMESTAMP(6) + INTERVAL ? MICROSECOND)
ON DUPLICATE KEY UPDATE owner = IF(expires_at > UTC_TIMESTAMP(6), owner, VALUES(owner)),
  expires_at = IF(expires_at > UTC_TIMESTAMP(6), expires_at, VALUES(expires_at))`)
			del := mustPrepare(b, db, `DELETE FROM bare_locks WHERE lock_key = ? AND owner = ?`)
			runParallelKeys(b, my.admin, p, &runs, func(key string, i int) {
				owner := fmt.Sprintf("owner-%s-%d", key, i)
				if _, err := up.ExecContext(ctx, key, owner, 10000000); err != nil {
					b.Error(err)
					return
				}
				if _, err := del.ExecContext(ctx, key, owner); err != nil {
					b.Error(err)
				}
			})
		})
	}
}

// runParallelKeys runs b.N cycles over p goroutines, each on a key of its
// own, and reports InnoDB's row lock waits and wait time per cycle.
func runParallelKeys(b *testing.B, admin *sql.DB, p int, runs *atomic.Int64, cycle func(key string, i int)) {
	run := runs.Add(1)
	keys := make([]string, p)
	for g := range p {
		keys[g] = fmt.Sprintf("par-%d-%d", run, g)
		cycle(keys[g], -1) // warm a connection per goroutine up
	}
	waits0, ms0 := rowLockStatus(b, admin)
	var (
		next atomic.Int64
		wg   sync.WaitGroup
	)
	b.ResetTimer()
	for g := range p {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i := next.Add(1)
				if i > int64(b.N) {
					return
				}
				cycle(keys[g], int(i))
			}
		}()
	}
	wg.Wait()
	b.StopTimer()
	waits1, ms1 := rowLockStatus(b, admin)
	b.ReportMetric(float64(waits1-waits0)/float64(b.N), "row-lock-waits/op")
	b.ReportMetric(float64(ms1-ms0)/float64(b.N), "row-lock-ms/op")
}

// rowLockStatus reads InnoDB's Innodb_row_lock_waits and
// Innodb_row_lock_time (ms) from the server's global status.
func rowLockStatus(b *testing.B, admin *sql.DB) (waits, ms int64) {
	rows, err := admin.Query(`SHOW GLOBAL STATUS WHERE Variable_name IN ('Innodb_row_lock_waits', 'Innodb_row_lock_time')`)
	if err != nil {
		b.Fatal(err)
	}
	defer rows.Close()
	for rows.Next() {
		var name string
		var v int64
		if err := rows.Scan(&name, &v); err != nil {
			b.Fatal(err)
		}
		switch name {
		case "Innodb_row_lock_waits":
			waits = v
		case "Innodb_row_lock_time":
			ms = v
		}
	}
	if err := rows.Err(); err != nil {
		b.Fatal(err)
	}
	return waits, ms
}
