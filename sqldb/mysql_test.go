package sqldb

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"fmt"
	"strings"
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

// tmpTables reads the session's internal temporary tables made so far
// (Created_tmp_tables, and of them on disk Created_tmp_disk_tables) on
// db's one connection.
func tmpTables(t *testing.T, db *sql.DB) (all, disk int64) {
	t.Helper()
	rows, err := db.QueryContext(t.Context(), "SHOW SESSION STATUS LIKE 'Created_tmp%tables'")
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	for rows.Next() {
		var (
			name string
			n    int64
		)
		if err := rows.Scan(&name, &n); err != nil {
			t.Fatal(err)
		}
		switch strings.ToLower(name) {
		case "created_tmp_tables":
			all = n
		case "created_tmp_disk_tables":
			disk = n
		}
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return all, disk
}

// testKindsNoTempTables counts the internal temporary tables each
// statement path of semaphores and read/write locks makes on the server:
// every attempt of a waiter runs one, so a table per statement (an
// aggregate over JSON_TABLE makes one, on disk when it holds JSON) is I/O
// that contention multiplies. The store under test has one connection,
// whose session counters are read before and after each step.
func testKindsNoTempTables(t *testing.T, my *myFixture) {
	db := my.db(t, nil)
	db.SetMaxOpenConns(1)
	db.SetMaxIdleConns(1)
	db.SetConnMaxLifetime(0)
	r := my.resource(t, db)
	var connID int64
	if err := db.QueryRow("SELECT CONNECTION_ID()").Scan(&connID); err != nil {
		t.Fatal(err)
	}
	// Reading the counters makes temporary tables of its own: what two
	// reads in a row count is taken off every step.
	a0, d0 := tmpTables(t, db)
	a1, d1 := tmpTables(t, db)
	readAll, readDisk := a1-a0, d1-d0

	semKey, rwKey := testsuite.Key(t), testsuite.Key(t)+"-rw"
	sem := func(waits bool) *backend.Lease {
		l := newLease(t, semKey, time.Minute)
		l.Kind, l.Limit, l.Waits = backend.KindSemaphore, 2, waits
		return l
	}
	rw := func(k backend.Kind) *backend.Lease {
		l := newLease(t, rwKey, time.Minute)
		l.Kind = k
		return l
	}
	s1, s2, s3, w, s4 := sem(false), sem(false), sem(false), sem(true), sem(false)
	rd, wr, rd2 := rw(backend.KindRead), rw(backend.KindWrite), rw(backend.KindRead)
	acquire := func(l *backend.Lease, want bool) func() error {
		return func() error {
			ok, _, err := r.TryAcquire(t.Context(), l)
			if err == nil && ok != want {
				err = fmt.Errorf("acquired %v; want %v", ok, want)
			}
			return err
		}
	}
	steps := []struct {
		name string
		do   func() error
	}{
		{"semaphore acquire granted (new row)", acquire(s1, true)},
		{"semaphore acquire granted (another holder)", acquire(s2, true)},
		{"semaphore refresh", func() error { return r.Refresh(t.Context(), s1) }},
		{"semaphore acquire refused", acquire(s3, false)},
		{"semaphore acquire refused, records an intent", acquire(w, false)},
		{"semaphore acquire refused, renews its intent", acquire(w, false)},
		{"semaphore withdraw", func() error { return r.Withdraw(t.Context(), w) }},
		{"semaphore acquire refused, records an intent again", acquire(w, false)},
		{"semaphore release, others left", func() error { return r.Release(t.Context(), s1) }},
		{"semaphore acquire granted, drops its intent", acquire(w, true)},
		{"semaphore release, one other left", func() error { return r.Release(t.Context(), s2) }},
		{"semaphore release, last entry", func() error { return r.Release(t.Context(), w) }},
		{"semaphore acquire granted (row deleted, new row)", acquire(s4, true)},
		{"semaphore release, the row's only entry", func() error { return r.Release(t.Context(), s4) }},
		{"read acquire granted", acquire(rd, true)},
		{"write acquire refused, records an intent", acquire(wr, false)},
		{"read acquire refused behind a writer's intent", acquire(rd2, false)},
		{"read refresh", func() error { return r.Refresh(t.Context(), rd) }},
		{"read withdraw", func() error { return r.Withdraw(t.Context(), rd2) }},
		{"read release, an intent left", func() error { return r.Release(t.Context(), rd) }},
		{"write acquire granted, drops its intent", acquire(wr, true)},
		{"write release", func() error { return r.Release(t.Context(), wr) }},
	}
	for _, st := range steps {
		a0, d0 := tmpTables(t, db)
		if err := st.do(); err != nil {
			t.Fatalf("%s: %v", st.name, err)
		}
		a1, d1 := tmpTables(t, db)
		all, disk := a1-a0-readAll, d1-d0-readDisk
		t.Logf("%-55s temporary tables %d, on disk %d", st.name, all, disk)
		if all != 0 || disk != 0 {
			t.Errorf("%s: %d temporary tables (%d on disk); want 0", st.name, all, disk)
		}
	}
	var id int64
	if err := db.QueryRow("SELECT CONNECTION_ID()").Scan(&id); err != nil || id != connID {
		t.Fatalf("the store's connection changed (%d, then %d, %v): the counters are not one session's", connID, id, err)
	}
	wantRows(t, my.fixture(), semKey)
	wantRows(t, my.fixture(), rwKey)
}

// testKindsExpiredEntries leaves entries of a semaphore's row to expire
// without their owners' release or withdrawal, as a process that died
// would: every rule passes over them, a grant or a new intent drops one
// per array, so they do not pile up in a row in use, and a grant on a row
// with no live entry writes its state anew.
func testKindsExpiredEntries(t *testing.T, my *myFixture) {
	r := my.resource(t, my.db(t, nil))
	key := testsuite.Key(t)
	sem := func(key string, ttl time.Duration, waits bool) *backend.Lease {
		l := newLease(t, key, ttl)
		l.Kind, l.Limit, l.Waits = backend.KindSemaphore, 2, waits
		return l
	}
	lengths := func(key string, wantH, wantI int, when string) {
		t.Helper()
		var h, i int
		err := my.admin.QueryRow("SELECT JSON_LENGTH(state, '$.h'), JSON_LENGTH(state, '$.i') FROM distlock_locks_kinds WHERE lock_key = ? AND kind = ?", key, rowSem).Scan(&h, &i)
		if err != nil || h != wantH || i != wantI {
			t.Fatalf("%s: %d holders and %d intents in the row (err %v); want %d and %d", when, h, i, err, wantH, wantI)
		}
	}
	live := func(key string, want int) {
		t.Helper()
		eventually(t, 10*time.Second, fmt.Sprintf("%d live requests", want), func() (bool, error) {
			n, err := my.requests(t.Context(), key, backend.KindSemaphore)
			return n == want, err
		})
	}
	a, b, w := sem(key, time.Minute, false), sem(key, 100*time.Millisecond, false), sem(key, 100*time.Millisecond, true)
	mustAcquire(t, r, a)
	mustAcquire(t, r, b)
	if ok, _, err := r.TryAcquire(t.Context(), w); ok || err != nil {
		t.Fatalf("a third acquire of 2 permits = %v, %v; want refused", ok, err)
	}
	lengths(key, 2, 1, "2 holders, 1 waiter")
	live(key, 1)
	c, d := sem(key, time.Minute, true), sem(key, time.Minute, true)
	mustAcquire(t, r, c)
	lengths(key, 2, 0, "a grant after a holder and a waiter expired")
	if ok, _, err := r.TryAcquire(t.Context(), d); ok || err != nil {
		t.Fatalf("a third acquire of 2 permits = %v, %v; want refused", ok, err)
	}
	lengths(key, 2, 1, "a live waiter")
	mustRelease(t, r, a)
	mustRelease(t, r, c)
	if err := r.Withdraw(t.Context(), d); err != nil {
		t.Fatal(err)
	}
	wantRows(t, my.fixture(), key)

	other := key + "-all-expired"
	x, y := sem(other, 100*time.Millisecond, false), sem(other, 100*time.Millisecond, false)
	mustAcquire(t, r, x)
	mustAcquire(t, r, y)
	live(other, 0)
	z := sem(other, time.Minute, false)
	mustAcquire(t, r, z)
	lengths(other, 1, 0, "a grant on a row whose entries all expired")
	if z.Token <= y.Token {
		t.Errorf("token %d after expired holders' %d; want it greater", z.Token, y.Token)
	}
	mustRelease(t, r, z)
	wantRows(t, my.fixture(), other)
}

// testKindsExpiredOwnEntry takes a write lock with the owner value of a
// read grant that expired while another reader holds (an application's
// ValueFunc may give one value per process): the expired entry, still in
// the row, must not count as the writer's grant.
func testKindsExpiredOwnEntry(t *testing.T, my *myFixture) {
	r := my.resource(t, my.db(t, nil))
	key := testsuite.Key(t)
	value := testsuite.Key(t)
	read := func(ttl time.Duration) *backend.Lease {
		l := newLease(t, key, ttl)
		l.Kind = backend.KindRead
		return l
	}
	mine, other, holder := read(100*time.Millisecond), read(100*time.Millisecond), read(time.Minute)
	mine.Value = value
	for _, l := range []*backend.Lease{mine, other, holder} {
		mustAcquire(t, r, l)
	}
	eventually(t, 10*time.Second, "one live reader", func() (bool, error) {
		in, err := r.Inspect(t.Context(), key, backend.KindRead)
		return len(in.Holders) == 1, err
	})
	w := newLease(t, key, time.Minute)
	w.Kind, w.Value = backend.KindWrite, value
	if ok, _, err := r.TryAcquire(t.Context(), w); ok || err != nil {
		t.Fatalf("a write attempt while a reader holds = %v, %v; want refused", ok, err)
	}
	if err := r.Withdraw(t.Context(), w); err != nil {
		t.Fatal(err)
	}
	mustRelease(t, r, holder)
	wantRows(t, my.fixture(), key)
}

// testKindsGrantToken: a grant writes its own token into the row's
// holders, whatever the connection's LAST_INSERT_ID was before the
// statement. A grant on a row whose entries had all gone (the readers
// released, only the writer's intent left) wrote the state from an
// expression that read no column, which MariaDB evaluated once, before
// the statement drew the token: the holder carried the previous
// statement's LAST_INSERT_ID (a release's outcome, 2; the distlock
// command's status showed the writer with a contended refusal's
// 9223372036863506787).
func testKindsGrantToken(t *testing.T, my *myFixture) {
	db := my.db(t, nil)
	db.SetMaxOpenConns(1) // one session: every statement sees the last one's LAST_INSERT_ID
	r := my.resource(t, db)
	key := testsuite.Key(t)
	lease := func(k backend.Kind) *backend.Lease {
		l := newLease(t, key, time.Minute)
		l.Kind, l.Waits = k, true
		return l
	}
	want := func(l *backend.Lease, when string) {
		t.Helper()
		in, err := r.Inspect(t.Context(), key, backend.KindWrite)
		if err != nil {
			t.Fatal(err)
		}
		for _, h := range in.Holders {
			if h.Kind == l.Kind && h.Token == l.Token {
				return
			}
		}
		t.Errorf("%s: holders %+v; want one of kind %v with the grant's token %d", when, in.Holders, l.Kind, l.Token)
	}
	rd, rd2, w := lease(backend.KindRead), lease(backend.KindRead), lease(backend.KindWrite)
	mustAcquire(t, r, rd)
	want(rd, "a reader on a new row")
	mustAcquire(t, r, rd2)
	want(rd2, "a second reader")
	if ok, _, err := r.TryAcquire(t.Context(), w); ok || err != nil {
		t.Fatalf("a writer's attempt while readers hold = %v, %v; want refused", ok, err)
	}
	mustRelease(t, r, rd)
	mustRelease(t, r, rd2)
	mustAcquire(t, r, w)
	want(w, "the writer, after the readers left")
	mustRelease(t, r, w)
	wantRows(t, my.fixture(), key)
}
