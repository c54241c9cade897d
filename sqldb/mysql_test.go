package sqldb

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"sync"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"

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
