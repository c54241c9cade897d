package sqldb

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"sync"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"

	"github.com/distlock/distlock/backend"
	"github.com/distlock/distlock/testsuite"
)

// argRecorder wraps the real driver (not a stand-in for the server) to see
// the arguments every statement sends.
type argRecorder struct {
	driver.Connector
	mu    sync.Mutex
	calls [][]driver.NamedValue
}

func (r *argRecorder) Connect(ctx context.Context) (driver.Conn, error) {
	c, err := r.Connector.Connect(ctx)
	if err != nil {
		return nil, err
	}
	return &recConn{Conn: c, r: r}, nil
}

func (r *argRecorder) reset() [][]driver.NamedValue {
	r.mu.Lock()
	defer r.mu.Unlock()
	c := r.calls
	r.calls = nil
	return c
}

type recConn struct {
	driver.Conn
	r *argRecorder
}

func (c *recConn) PrepareContext(ctx context.Context, query string) (driver.Stmt, error) {
	st, err := c.Conn.(driver.ConnPrepareContext).PrepareContext(ctx, query)
	if err != nil {
		return nil, err
	}
	return &recStmt{Stmt: st, r: c.r}, nil
}

type recStmt struct {
	driver.Stmt
	r *argRecorder
}

func (s *recStmt) ExecContext(ctx context.Context, args []driver.NamedValue) (driver.Result, error) {
	s.r.mu.Lock()
	s.r.calls = append(s.r.calls, args)
	s.r.mu.Unlock()
	return s.Stmt.(driver.StmtExecContext).ExecContext(ctx, args)
}

func (s *recStmt) QueryContext(ctx context.Context, args []driver.NamedValue) (driver.Rows, error) {
	s.r.mu.Lock()
	s.r.calls = append(s.r.calls, args)
	s.r.mu.Unlock()
	return s.Stmt.(driver.StmtQueryContext).QueryContext(ctx, args)
}

// testMySQLNoClientTime checks what goes to MariaDB: each operation on the
// common path is one statement, and no statement carries a time from the
// client, only the key, the owner value and the TTL in microseconds.
func testMySQLNoClientTime(t *testing.T, my *myFixture) {
	cfg, err := mysql.ParseDSN(my.dsn)
	if err != nil {
		t.Fatal(err)
	}
	conn, err := mysql.NewConnector(cfg)
	if err != nil {
		t.Fatal(err)
	}
	rec := &argRecorder{Connector: conn}
	db := sql.OpenDB(rec)
	t.Cleanup(func() { db.Close() })
	r := my.resource(t, db)

	key := testsuite.Key(t)
	l := newLease(t, key, 3*time.Second)
	rec.reset()
	ops := []struct {
		name string
		do   func() error
	}{
		{"acquire", func() error { _, _, err := r.TryAcquire(t.Context(), l); return err }},
		{"contended acquire", func() error {
			_, _, err := r.TryAcquire(t.Context(), newLease(t, key, time.Second))
			return err
		}},
		{"refresh", func() error { return r.Refresh(t.Context(), l) }},
		{"release", func() error { return r.Release(t.Context(), l) }},
	}
	for _, op := range ops {
		if err := op.do(); err != nil {
			t.Fatalf("%s: %v", op.name, err)
		}
		calls := rec.reset()
		if len(calls) != 1 {
			t.Errorf("%s: %d statements; want 1", op.name, len(calls))
		}
		for _, args := range calls {
			for _, a := range args {
				switch a.Value.(type) {
				case string, int64:
				default:
					t.Errorf("%s: argument %d is %T (%v); want only strings and integers", op.name, a.Ordinal, a.Value, a.Value)
				}
			}
		}
	}
}

// testCounterRowDeleted deletes the fencing counter row behind the
// backend's back: the next acquire recreates it, and tokens still increase.
func testCounterRowDeleted(t *testing.T, my *myFixture) {
	r := my.resource(t, my.db(t, nil))
	key := testsuite.Key(t)
	l1 := newLease(t, key, time.Minute)
	mustAcquire(t, r, l1)
	if err := r.Release(t.Context(), l1); err != nil {
		t.Fatal(err)
	}
	if _, err := my.admin.Exec("DELETE FROM distlock_locks WHERE lock_key = ''"); err != nil {
		t.Fatal(err)
	}
	l2 := newLease(t, key, time.Minute)
	mustAcquire(t, r, l2)
	if l2.Token <= l1.Token {
		t.Fatalf("token after the counter row was deleted %d <= previous %d", l2.Token, l1.Token)
	}
	l3 := newLease(t, testsuite.Key(t), time.Minute)
	mustAcquire(t, r, l3)
	if l3.Token != l2.Token+1 {
		t.Errorf("next token %d; want %d (the counter counts on from its new start)", l3.Token, l2.Token+1)
	}
	for _, l := range []*backend.Lease{l2, l3} {
		if err := r.Release(t.Context(), l); err != nil {
			t.Fatal(err)
		}
	}
}
