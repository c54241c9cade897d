package sqldb

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/distlock/distlock/backend"
	"github.com/distlock/distlock/testsuite"
)

// exercise runs one acquire, contended acquire, refresh and release on r.
func exercise(t *testing.T, r, other resource) {
	t.Helper()
	key := testsuite.Key(t)
	l := newLease(t, key, time.Minute)
	mustAcquire(t, r, l)
	if ok, _, err := other.TryAcquire(t.Context(), newLease(t, key, time.Minute)); ok || err != nil {
		t.Fatalf("contended TryAcquire = %v, %v; want false, nil", ok, err)
	}
	if err := r.Refresh(t.Context(), l); err != nil {
		t.Fatalf("Refresh: %v", err)
	}
	if err := r.Release(t.Context(), l); err != nil {
		t.Fatalf("Release: %v", err)
	}
	// A semaphore's permit and a read/write lock's intent: the kinds
	// table.
	s := newLease(t, key, time.Minute)
	s.Kind, s.Limit = backend.KindSemaphore, 1
	mustAcquire(t, r, s)
	w := newLease(t, key, time.Minute)
	w.Kind = backend.KindWrite
	mustAcquire(t, other, w)
	rd := newLease(t, key, time.Minute)
	rd.Kind = backend.KindRead
	if ok, _, err := r.TryAcquire(t.Context(), rd); ok || err != nil {
		t.Fatalf("read while written: TryAcquire = %v, %v; want false, nil", ok, err)
	}
	if err := r.Release(t.Context(), s); err != nil {
		t.Fatalf("Release(semaphore): %v", err)
	}
	if err := other.Release(t.Context(), w); err != nil {
		t.Fatalf("Release(write): %v", err)
	}
	if err := r.(backend.Withdrawer).Withdraw(t.Context(), rd); err != nil {
		t.Fatalf("Withdraw: %v", err)
	}
}

// testConcurrentSetup builds several resources on a table that does not
// exist yet, at once, as processes starting together would.
func testConcurrentSetup(t *testing.T, newRes func(t testing.TB, opts ...Option) (resource, error)) {
	const n = 4
	table := fmt.Sprintf("locks_%d", time.Now().UnixNano()%1e9)
	rs := make([]resource, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rs[i], errs[i] = newRes(t, WithTable(table))
		}()
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Fatalf("constructor %d on a new table: %v", i, err)
		}
	}
	exercise(t, rs[0], rs[n-1])
	// And once more on the now existing table.
	r, err := newRes(t, WithTable(table))
	if err != nil {
		t.Fatalf("constructor on an existing table: %v", err)
	}
	exercise(t, r, rs[1])
}

func pgNewRes(pg *pgFixture) func(t testing.TB, opts ...Option) (resource, error) {
	return func(t testing.TB, opts ...Option) (resource, error) {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		p, err := NewPostgres(ctx, pg.pool(t, nil), opts...)
		if err == nil {
			t.Cleanup(func() { p.Close() })
		}
		return p, err
	}
}

func myNewRes(my *myFixture) func(t testing.TB, opts ...Option) (resource, error) {
	return func(t testing.TB, opts ...Option) (resource, error) {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		m, err := NewMySQL(ctx, my.db(t, nil), opts...)
		if err == nil {
			t.Cleanup(func() { m.Close() })
		}
		return m, err
	}
}

// testPostgresLeastPrivilege runs the backend as a role with only the
// privileges the package doc lists for an existing table, and checks that
// the role could not have created the table itself.
func testPostgresLeastPrivilege(t *testing.T, pg *pgFixture) {
	table := fmt.Sprintf("priv_%d", time.Now().UnixNano()%1e9)
	owner := pg.resource(t, pg.pool(t, nil), WithTable(table)) // creates it
	role := "app_" + table
	for _, q := range []string{
		`CREATE ROLE ` + role + ` LOGIN`,
		`GRANT SELECT, INSERT, UPDATE, DELETE ON ` + table + `, ` + table + `_kinds TO ` + role,
		`GRANT USAGE ON SEQUENCE ` + table + `_token_seq TO ` + role,
	} {
		if _, err := pg.admin.Exec(t.Context(), q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	t.Cleanup(func() {
		ctx := context.Background()
		pg.admin.Exec(ctx, `REVOKE ALL ON `+table+`, `+table+`_kinds FROM `+role)
		pg.admin.Exec(ctx, `REVOKE ALL ON SEQUENCE `+table+`_token_seq FROM `+role)
	})
	asRole := func(c *pgxpool.Config) { c.ConnConfig.User = role }
	pool := pg.pool(t, asRole)
	if _, err := pool.Exec(t.Context(), `CREATE TABLE should_fail (x int)`); err == nil {
		t.Fatalf("the role can create tables; the test proves nothing")
	}
	r := pg.resource(t, pool, WithTable(table))
	exercise(t, r, owner)
	// A missing table is an error that says so, for a role that cannot
	// create it.
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	if _, err := NewPostgres(ctx, pool, WithTable("absent_"+table)); err == nil {
		t.Errorf("NewPostgres without CREATE privilege on a missing table succeeded")
	}
}

// testMySQLLeastPrivilege is the same for MariaDB.
func testMySQLLeastPrivilege(t *testing.T, my *myFixture) {
	table := fmt.Sprintf("priv_%d", time.Now().UnixNano()%1e9)
	owner := my.resource(t, my.db(t, nil), WithTable(table))
	user := "app_" + table
	var dbName string
	if err := my.admin.QueryRow("SELECT DATABASE()").Scan(&dbName); err != nil {
		t.Fatal(err)
	}
	for _, q := range []string{
		"CREATE USER '" + user + "'@'%'",
		"GRANT SELECT, INSERT, UPDATE, DELETE ON `" + dbName + "`.`" + table + "` TO '" + user + "'@'%'",
		"GRANT SELECT, INSERT, UPDATE, DELETE ON `" + dbName + "`.`" + table + "_kinds` TO '" + user + "'@'%'",
	} {
		if _, err := my.admin.Exec(q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	t.Cleanup(func() { my.admin.Exec("DROP USER '" + user + "'@'%'") })
	db := my.db(t, func(c *mysql.Config) { c.User, c.Passwd = user, "" })
	if _, err := db.Exec("CREATE TABLE should_fail (x int)"); err == nil {
		t.Fatalf("the user can create tables; the test proves nothing")
	}
	r := my.resource(t, db, WithTable(table))
	exercise(t, r, owner)
}
