package sqldb

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"fmt"
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

// testCounterRowDeleted deletes a key's counter row behind the backend's
// back: the next acquire recreates it, and tokens still increase. A key
// of the same bucket counts on from there; every token is the holder's
// counter plus one.
func testCounterRowDeleted(t *testing.T, my *myFixture) {
	table := fmt.Sprintf("ctr_%d", time.Now().UnixNano()%1e9)
	r := my.resource(t, my.db(t, nil), WithTable(table))
	key := testsuite.Key(t)
	acquire := func(key string) *backend.Lease {
		t.Helper()
		l := newLease(t, key, time.Minute)
		mustAcquire(t, r, l)
		if err := r.Release(t.Context(), l); err != nil {
			t.Fatal(err)
		}
		return l
	}
	l1 := acquire(key)
	if n, err := my.admin.Exec("DELETE FROM "+table+" WHERE lock_key = ?", counterKey(key)); err != nil {
		t.Fatal(err)
	} else if got, _ := n.RowsAffected(); got != 1 {
		t.Fatalf("deleted %d counter rows; want 1", got)
	}
	l2 := acquire(key)
	if l2.Token <= l1.Token {
		t.Fatalf("token after the counter row was deleted %d <= previous %d", l2.Token, l1.Token)
	}
	same := key
	for i := 0; same == key || counterKey(same) != counterKey(key); i++ {
		same = fmt.Sprintf("%s-%d", key, i)
	}
	if l3 := acquire(same); l3.Token != l2.Token+1 {
		t.Errorf("next token in the bucket %d; want %d (the counter counts on from its new start)", l3.Token, l2.Token+1)
	}
	var rows int
	if err := my.admin.QueryRow("SELECT COUNT(*) FROM " + table).Scan(&rows); err != nil || rows != 1 {
		t.Errorf("%d rows left (err %v); want 1: the bucket's counter", rows, err)
	}
}

// rowLockWaits is the number of InnoDB row lock waits under way on the
// server (Innodb_row_lock_current_waits: live, unlike the
// information_schema lock tables, which are cached).
func rowLockWaits(ctx context.Context, admin *sql.DB) (int, error) {
	var (
		name string
		n    int
	)
	err := admin.QueryRowContext(ctx, "SHOW GLOBAL STATUS LIKE 'Innodb_row_lock_current_waits'").Scan(&name, &n)
	return n, err
}

// testKeysDoNotSerialize holds one key's acquire on the server after it
// has drawn its token (it waits for the key's row, which an admin
// transaction locks): an acquire of a key whose token comes from another
// counter must not wait for it (one counter row for the whole table would
// make every acquire wait for every other until it committed).
func testKeysDoNotSerialize(t *testing.T, my *myFixture) {
	r := my.resource(t, my.db(t, nil))
	ctx := context.Background()
	k1 := testsuite.Key(t)
	k2 := k1 + "-other"
	for i := 0; counterKey(k2) == counterKey(k1); i++ {
		k2 = fmt.Sprintf("%s-other%d", k1, i)
	}
	if n, err := rowLockWaits(ctx, my.admin); n != 0 || err != nil {
		t.Fatalf("%d row lock waits on the server before the test (err %v)", n, err)
	}
	holder := newLease(t, k1, time.Minute)
	mustAcquire(t, r, holder)
	tx, err := my.admin.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback()
	var owner string
	if err := tx.QueryRowContext(ctx, "SELECT owner FROM distlock_locks WHERE lock_key = ? FOR UPDATE", k1).Scan(&owner); err != nil {
		t.Fatal(err)
	}
	type result struct {
		ok  bool
		err error
	}
	acquire := func(l *backend.Lease) <-chan result {
		ch := make(chan result, 1)
		go func() {
			ok, _, err := r.TryAcquire(ctx, l)
			ch <- result{ok, err}
		}()
		return ch
	}
	res1 := acquire(newLease(t, k1, time.Minute))
	eventually(t, 10*time.Second, "the acquire of k1 waits for k1's row", func() (bool, error) {
		n, err := rowLockWaits(ctx, my.admin)
		return n >= 1, err
	})
	l2 := newLease(t, k2, time.Minute)
	res2 := acquire(l2)
	var (
		r2   result
		done bool
	)
	eventually(t, 10*time.Second, "the acquire of k2 finished or waits", func() (bool, error) {
		select {
		case r2 = <-res2:
			done = true
			return true, nil
		default:
		}
		n, err := rowLockWaits(ctx, my.admin)
		return n >= 2, err
	})
	if !done {
		t.Errorf("the acquire of %q waits for the acquire of %q: acquires of different keys serialize", k2, k1)
	}
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
	if r1 := <-res1; r1.ok || r1.err != nil {
		t.Errorf("acquire of k1 while held = %v, %v; want false, nil", r1.ok, r1.err)
	}
	if !done {
		r2 = <-res2
	}
	if !r2.ok || r2.err != nil {
		t.Fatalf("acquire of k2 = %v, %v; want acquired", r2.ok, r2.err)
	}
	for _, l := range []*backend.Lease{holder, l2} {
		if err := r.Release(ctx, l); err != nil {
			t.Fatal(err)
		}
	}
	wantRows(t, my.fixture(), k1)
	wantRows(t, my.fixture(), k2)
}
