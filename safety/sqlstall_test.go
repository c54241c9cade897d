package safety

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"hash/crc32"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/distlock/distlock"
	"github.com/distlock/distlock/safety/harness"
)

// sqlStall is what the stalled-table scenario needs of a SQL database.
type sqlStall struct {
	// how names the lock, for the report.
	how string
	// lock has another session lock table until resume.
	lock func(t testing.TB, table string) (resume func())
	// running counts the acquire statements on table the server runs.
	running func(ctx context.Context, table string) (int, error)
	// audit prepares table for counting commits; count then starts
	// counting the acquire statements on keys that commit.
	audit func(t testing.TB, table string) (count func(t testing.TB, keys ...string) func(ctx context.Context) (int, error))
	// rows lists the owners of key's rows in table.
	rows func(ctx context.Context, table, key string) ([]string, error)
}

// pgStall: LOCK TABLE in a transaction; a trigger records every lock row
// written.
func pgStall(t testing.TB, dsn string) sqlStall {
	admin, err := pgxpool.New(context.Background(), dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(admin.Close)
	return sqlStall{
		how: "LOCK TABLE in a transaction",
		lock: func(t testing.TB, table string) func() {
			ctx := context.Background()
			tx, err := admin.Begin(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := tx.Exec(ctx, "LOCK TABLE "+table+" IN ACCESS EXCLUSIVE MODE"); err != nil {
				_ = tx.Rollback(ctx)
				t.Fatal(err)
			}
			return func() {
				if err := tx.Rollback(ctx); err != nil {
					t.Errorf("unlock %s: %v", table, err)
				}
			}
		},
		running: func(ctx context.Context, table string) (int, error) {
			var n int
			err := admin.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity
WHERE state = 'active' AND pid <> pg_backend_pid() AND query LIKE 'INSERT INTO "public".' || quote_ident($1) || '%'`, table).Scan(&n)
			return n, err
		},
		audit: func(t testing.TB, table string) func(testing.TB, ...string) func(context.Context) (int, error) {
			if _, err := admin.Exec(context.Background(), `CREATE TABLE IF NOT EXISTS audit_`+table+` (lock_key text NOT NULL);
CREATE OR REPLACE FUNCTION audit_`+table+`() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  INSERT INTO audit_`+table+` VALUES (NEW.lock_key);
  RETURN NEW;
END $$;
DROP TRIGGER IF EXISTS audit ON `+table+`;
CREATE TRIGGER audit AFTER INSERT OR UPDATE ON `+table+` FOR EACH ROW EXECUTE FUNCTION audit_`+table+`()`); err != nil {
				t.Fatalf("audit %s: %v", table, err)
			}
			return func(_ testing.TB, keys ...string) func(context.Context) (int, error) {
				return func(ctx context.Context) (int, error) {
					var n int
					err := admin.QueryRow(ctx, `SELECT count(*) FROM audit_`+table+` WHERE lock_key = ANY($1)`, keys).Scan(&n)
					return n, err
				}
			}
		},
		rows: func(ctx context.Context, table, key string) ([]string, error) {
			rows, err := admin.Query(ctx, "SELECT owner FROM "+table+" WHERE lock_key = $1", key)
			if err != nil {
				return nil, err
			}
			return pgx.CollectRows(rows, pgx.RowTo[string])
		},
	}
}

// mariaCounterKey is the fencing counter row a key draws its tokens from
// (sqldb's table format: "\x00distlock:token:" + crc32(key) % 1024).
func mariaCounterKey(key string) string {
	return "\x00distlock:token:" + strconv.FormatUint(uint64(crc32.ChecksumIEEE([]byte(key))%1024), 10)
}

// mariaStall: LOCK TABLES ... WRITE; commits are counted by the keys'
// fencing counters, which every acquire statement that commits bumps
// once (a trigger on the lock table would lose the acquire's
// LAST_INSERT_ID).
func mariaStall(t testing.TB, db *sql.DB) sqlStall {
	return sqlStall{
		how: "LOCK TABLES ... WRITE",
		lock: func(t testing.TB, table string) func() {
			ctx := context.Background()
			c, err := db.Conn(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := c.ExecContext(ctx, "LOCK TABLES `"+table+"` WRITE"); err != nil {
				_ = c.Close()
				t.Fatal(err)
			}
			return func() {
				defer c.Close()
				if _, err := c.ExecContext(ctx, "UNLOCK TABLES"); err != nil {
					t.Errorf("UNLOCK TABLES: %v", err)
				}
			}
		},
		running: func(ctx context.Context, table string) (int, error) {
			var n int
			err := db.QueryRowContext(ctx, "SELECT COUNT(*) FROM information_schema.PROCESSLIST WHERE ID <> CONNECTION_ID() AND (INFO LIKE CONCAT('INSERT INTO `', ?, '`%') OR INFO LIKE CONCAT('SET STATEMENT %INSERT INTO `', ?, '`%'))", table, table).Scan(&n)
			return n, err
		},
		audit: func(_ testing.TB, table string) func(testing.TB, ...string) func(context.Context) (int, error) {
			counters := func(ctx context.Context, keys []string) (map[string]uint64, error) {
				m := map[string]uint64{}
				for _, k := range keys {
					var tok uint64
					err := db.QueryRowContext(ctx, "SELECT token FROM `"+table+"` WHERE lock_key = ?", mariaCounterKey(k)).Scan(&tok)
					if err != nil && !errors.Is(err, sql.ErrNoRows) {
						return nil, err
					}
					m[mariaCounterKey(k)] = tok
				}
				return m, nil
			}
			return func(t testing.TB, keys ...string) func(context.Context) (int, error) {
				before, err := counters(context.Background(), keys)
				if err != nil {
					t.Fatal(err)
				}
				return func(ctx context.Context) (int, error) {
					after, err := counters(ctx, keys)
					n := 0
					for c, tok := range after {
						switch {
						case before[c] == 0 && tok != 0:
							n++ // made by an acquire, at the server's time
						case tok > before[c]:
							n += int(tok - before[c])
						}
					}
					return n, err
				}
			}
		},
		rows: func(ctx context.Context, table, key string) ([]string, error) {
			rows, err := db.QueryContext(ctx, "SELECT owner FROM `"+table+"` WHERE lock_key = ?", key)
			if err != nil {
				return nil, err
			}
			defer rows.Close()
			return sqlRows(key, rows.Scan, rows.Next, rows.Err)
		},
	}
}

// stallBound is how far past its bound a call may return before the
// scenario fails; the figures it reports are the measure.
const stallBound = time.Second

// testStalledTable is a stalled store as a fault: another session locks
// the lock table (as a migration would) while one process holds a lock
// and tries others. TryLock with a 300ms context and a 5s wait, TryLock
// with a 500ms wait, and Unlock with a 300ms context must each return
// within its bound; the abandoned acquire statements must end on the
// server while the table is still locked (PostgreSQL: cancelled;
// MariaDB: cut at their server-side bound); once the table is unlocked,
// none of them may commit (late grants: counted by a trigger on
// PostgreSQL and by the fencing counters on MariaDB), and nothing may be
// left once the clean-ups ran (orphans). Recovery is from the unlock to
// another process's lock of the abandoned key.
func testStalledTable(t *testing.T, tg target, st sqlStall) {
	const table = "stall_locks"
	ctx := t.Context()
	b := tg.backend
	b.Table = table
	// newLock is a process over its own resource (Close closes it).
	newLock := func() *distlock.DistributeLock {
		res, closeRes, err := b.Open(ctx) // the first creates the table
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(closeRes)
		d, err := distlock.New(res, distlock.WithDefaultTTL(time.Minute))
		if err != nil {
			t.Fatal(err)
		}
		return d
	}
	newLock().Close()
	startCount := st.audit(t, table)

	type figure struct {
		what  string
		bound time.Duration
		worst time.Duration
	}
	figs := []*figure{
		{what: "TryLock(300ms ctx, 5s wait)", bound: 300 * time.Millisecond},
		{what: "TryLock(500ms wait)", bound: 500 * time.Millisecond},
		{what: "Unlock(300ms ctx)", bound: 300 * time.Millisecond},
	}
	timed := func(f *figure, fn func() error) error {
		start := time.Now()
		err := fn()
		el := time.Since(start)
		f.worst = max(f.worst, el)
		if el > f.bound+stallBound {
			t.Errorf("%s returned after %v; its bound was %v", f.what, el, f.bound)
		}
		return err
	}
	rounds := 3 * soak
	var acquisitions, late, orphaned int
	var ended, recovery time.Duration
	for i := range rounds {
		d, other := newLock(), newLock()
		key := fmt.Sprintf("%s-%d", uniqueKey(t), i)
		kHeld, kCtx, kWait := key+"-held", key+"-ctx", key+"-wait"
		held, err := d.TryLock(ctx, kHeld, 0)
		if err != nil {
			t.Fatal(err)
		}
		acquisitions++
		count := startCount(t, kCtx, kWait)
		resume := st.lock(t, table)
		err = timed(figs[0], func() error {
			cctx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
			defer cancel()
			_, err := d.TryLock(cctx, kCtx, 5*time.Second)
			return err
		})
		if !errors.Is(err, distlock.ErrNotAcquired) || !errors.Is(err, context.DeadlineExceeded) {
			t.Errorf("TryLock with a 300ms context = %v; want ErrNotAcquired joined with context.DeadlineExceeded", err)
		}
		err = timed(figs[1], func() error {
			_, err := d.TryLock(ctx, kWait, 500*time.Millisecond)
			return err
		})
		if !errors.Is(err, context.DeadlineExceeded) || errors.Is(err, distlock.ErrNotAcquired) {
			t.Errorf("TryLock with a 500ms wait = %v; want a store error wrapping context.DeadlineExceeded", err)
		}
		abandonedAt := time.Now()
		waitUntil(t, 30*time.Second, "the abandoned acquire statements to end on the server", func() bool {
			n, err := st.running(ctx, table)
			return err == nil && n == 0
		})
		ended = max(ended, time.Since(abandonedAt))
		err = timed(figs[2], func() error {
			cctx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
			defer cancel()
			return held.Unlock(cctx)
		})
		if err == nil {
			t.Errorf("Unlock on a locked table = nil; want an error")
		}
		resume()
		resumedAt := time.Now()
		if err := held.Unlock(ctx); err != nil && !errors.Is(err, distlock.ErrNotHeld) {
			t.Errorf("Unlock once the table is unlocked = %v", err)
		}
		if err := d.Close(); err != nil { // waits for the clean-ups
			t.Errorf("Close once the table is unlocked = %v", err)
		}
		lk, err := other.TryLock(ctx, kCtx, 10*time.Second)
		if err != nil {
			t.Fatalf("another process's TryLock of the abandoned key once the table is unlocked: %v", err)
		}
		recovery = max(recovery, time.Since(resumedAt))
		acquisitions++
		if err := lk.Unlock(ctx); err != nil {
			t.Errorf("Unlock: %v", err)
		}
		if err := other.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
		n, err := count(ctx)
		if err != nil {
			t.Fatal(err)
		}
		late += n - 1 // the other process's lock of kCtx committed once
		for _, k := range []string{kHeld, kCtx, kWait} {
			left, err := st.rows(ctx, table, k)
			if err != nil {
				t.Fatal(err)
			}
			if len(left) > 0 {
				t.Logf("orphans of %s: %v", k, left)
			}
			orphaned += len(left)
		}
	}
	var notes []string
	for _, f := range figs {
		notes = append(notes, fmt.Sprintf("%s worst %v", f.what, f.worst.Round(time.Millisecond)))
	}
	out := &harness.Result{
		Backend: tg.name, Fault: "lock table locked by another session (" + st.how + ")",
		Acquisitions: acquisitions, Orphans: orphaned, LossLatency: -1, Recovery: recovery,
		Notes: fmt.Sprintf("%d rounds of 3 calls; %s; abandoned statements ended on the server within %v of the second TryLock's return; %d late grants; recovery from the unlock",
			rounds, strings.Join(notes, ", "), ended.Round(time.Millisecond), late),
	}
	out.Log(t)
	if late != 0 {
		t.Errorf("%d acquire statements of abandoned attempts committed once the table was unlocked; want 0", late)
	}
	if orphaned != 0 {
		t.Errorf("%d orphans; want 0", orphaned)
	}
}
