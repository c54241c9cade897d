package main

import (
	"context"
	"database/sql"
	"errors"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-sql-driver/mysql"

	"github.com/distlock/distlock/internal/stores"
)

// MySQL (the MariaDB server the tests use) has no client tracer to count
// statements with, so both peers are counted at the server: its
// Questions status (the statements clients sent), less the program's own
// SHOW STATUS statements (myShows). Its peers run in the uncontended,
// contended and handoff workloads.
var myShows atomic.Int64

func init() {
	only := []string{"uncontended", "contended", "handoff"}
	register(&peer{
		name: "floor", store: "mysql", ref: true, serverRequests: true, only: only,
		note:     "bare database/sql: INSERT .. ON DUPLICATE KEY UPDATE taking an expired row (server clock), DELETE by key and owner; retry every 10ms",
		open:     openMyFloor,
		counters: myCounters,
	})
	register(&peer{
		name: "distlock", store: "mysql", serverRequests: true, only: only,
		note: "sqldb.NewMySQL, defaults: one statement per attempt, one per release; waiters spin (no wake-up channel)",
		open: func(ctx context.Context, s *servers, o openOpts) (instance, error) {
			dsn, err := s.mysqlDSN()
			if err != nil {
				return nil, err
			}
			return openDistlock(ctx, "mysql://"+dsn, o, &myProbe{s: s}, stores.Options{})
		},
		counters: myCounters,
	})
}

// myQuestions returns the server's Questions less the program's SHOW
// STATUS statements, this one included.
func (s *servers) myQuestions(ctx context.Context) (int64, error) {
	db, err := s.mysqlAdmin()
	if err != nil {
		return 0, err
	}
	var name string
	var n int64
	shows := myShows.Add(1)
	if err := db.QueryRowContext(ctx, "SHOW GLOBAL STATUS LIKE 'Questions'").Scan(&name, &n); err != nil {
		return 0, err
	}
	return n - shows, nil
}

func myCounters(ctx context.Context, s *servers) (counts, error) {
	n, err := s.myQuestions(ctx)
	if err != nil {
		return counts{}, err
	}
	return counts{rt: n, cmds: n}, nil
}

// myProbe tells the handoff workload that a waiter tried: the server
// counted a statement since the mark (MySQL's waiters make no other).
type myProbe struct{ s *servers }

func (p *myProbe) mark(string) int64 {
	n, _ := p.s.myQuestions(context.Background())
	return n
}

func (p *myProbe) waiting(ctx context.Context, _ string, mark int64) bool {
	n, err := p.s.myQuestions(ctx)
	return err == nil && n > mark
}

// --- floor ---

const (
	myFloorTable = `CREATE TABLE IF NOT EXISTS bare_locks (
  lock_key   varchar(255) COLLATE utf8mb4_bin PRIMARY KEY,
  owner      varchar(64) NOT NULL,
  expires_at datetime(6) NOT NULL
)`
	// Affected rows: 1 for an insert, 2 for an expired row taken, 0 for
	// a live one (left as it was).
	myFloorUpsert = `INSERT INTO bare_locks (lock_key, owner, expires_at)
VALUES (?, ?, NOW(6) + INTERVAL ? MICROSECOND)
ON DUPLICATE KEY UPDATE
  owner      = IF(expires_at <= NOW(6), VALUES(owner), owner),
  expires_at = IF(expires_at <= NOW(6), VALUES(expires_at), expires_at)`
	myFloorDelete = `DELETE FROM bare_locks WHERE lock_key = ? AND owner = ?`
)

var myFloorOnce sync.Mutex // serialises CREATE TABLE IF NOT EXISTS

type myFloor struct {
	*myProbe
	db     *sql.DB
	micros int64
	retry  time.Duration
	floorValues
}

// myMaxConns is the size of every instance's pool, as pgMaxConns.
const myMaxConns = 20

func openMyFloor(ctx context.Context, s *servers, o openOpts) (instance, error) {
	dsn, err := s.mysqlDSN()
	if err != nil {
		return nil, err
	}
	cfg, err := mysql.ParseDSN(dsn)
	if err != nil {
		return nil, err
	}
	conn, err := mysql.NewConnector(cfg)
	if err != nil {
		return nil, err
	}
	db := sql.OpenDB(conn)
	db.SetMaxOpenConns(myMaxConns)
	db.SetMaxIdleConns(myMaxConns)
	myFloorOnce.Lock()
	_, err = db.ExecContext(ctx, myFloorTable)
	myFloorOnce.Unlock()
	if err != nil {
		db.Close()
		return nil, err
	}
	return &myFloor{myProbe: &myProbe{s: s}, db: db, micros: int64((o.ttl + time.Microsecond - 1) / time.Microsecond),
		retry: o.retry, floorValues: newFloorValues()}, nil
}

// try makes one attempt: false when another owner holds key.
func (f *myFloor) try(ctx context.Context, key, v string) (bool, error) {
	res, err := f.db.ExecContext(ctx, myFloorUpsert, key, v, f.micros)
	if err != nil {
		return false, err
	}
	n, err := res.RowsAffected()
	return n > 0, err
}

func (f *myFloor) release(ctx context.Context, key, v string) error {
	res, err := f.db.ExecContext(ctx, myFloorDelete, key, v)
	if err != nil {
		return err
	}
	if n, err := res.RowsAffected(); err != nil || n != 1 {
		return errors.New("floor: lock not held at release")
	}
	return nil
}

func (f *myFloor) cycle(ctx context.Context, key string) error {
	v := f.value()
	ok, err := f.try(ctx, key, v)
	if err != nil {
		return err
	}
	if !ok {
		return errNotAcquired
	}
	return f.release(ctx, key, v)
}

func (f *myFloor) worker(context.Context) (locker, error) { return f, nil }

func (f *myFloor) lock(ctx context.Context, key string, wait time.Duration) (held, error) {
	v := f.value()
	err := pollFloor(ctx, wait, f.retry, func() (bool, error) { return f.try(ctx, key, v) })
	if err != nil {
		return nil, err
	}
	return &myFloorHeld{f, key, v}, nil
}

func (f *myFloor) close() error { return f.db.Close() }

// myFloorHeld is what a user of the bare floor keeps: key and value.
type myFloorHeld struct {
	f        *myFloor
	key, val string
}

func (h *myFloorHeld) unlock(ctx context.Context) error { return h.f.release(ctx, h.key, h.val) }
