package sqldb

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/go-sql-driver/mysql"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/distlock/distlock"
	"github.com/distlock/distlock/fence"
)

// fenceTx is one transaction through a fence implementation under test.
type fenceTx interface {
	check(ctx context.Context, resource string, token uint64) error
	// exec runs one of the caller's own writes in the transaction; the
	// statement is written with ? placeholders.
	exec(ctx context.Context, stmt string, args ...any) error
	commit(ctx context.Context) error
	rollback(ctx context.Context) error
}

// fenceImpl is a fence implementation and its database.
type fenceImpl struct {
	name  string
	begin func(ctx context.Context) (fenceTx, error)
	// closedTx returns a transaction that has been rolled back: any
	// statement on it fails.
	closedTx func(t *testing.T) fenceTx
	// one reads one integer.
	one func(ctx context.Context, stmt string, args ...any) (int64, error)
	// retry reports whether err is a deadlock or serialization failure:
	// the transaction is to be run again.
	retry func(err error) bool
}

// sqlTx is a database/sql transaction checked by fence.SQL.
type sqlTx struct {
	f     *fence.SQL
	tx    *sql.Tx
	dollo bool // rewrite ? to $n
}

func (s sqlTx) check(ctx context.Context, r string, tok uint64) error {
	return s.f.Check(ctx, s.tx, r, tok)
}

func (s sqlTx) exec(ctx context.Context, stmt string, args ...any) error {
	if s.dollo {
		stmt = dollars(stmt)
	}
	_, err := s.tx.ExecContext(ctx, stmt, args...)
	return err
}
func (s sqlTx) commit(context.Context) error   { return s.tx.Commit() }
func (s sqlTx) rollback(context.Context) error { return s.tx.Rollback() }

// pgxTx is a pgx transaction checked by PostgresFence.
type pgxTx struct {
	f  *PostgresFence
	tx pgx.Tx
}

func (p pgxTx) check(ctx context.Context, r string, tok uint64) error {
	return p.f.Check(ctx, p.tx, r, tok)
}

func (p pgxTx) exec(ctx context.Context, stmt string, args ...any) error {
	_, err := p.tx.Exec(ctx, dollars(stmt), args...)
	return err
}
func (p pgxTx) commit(ctx context.Context) error   { return p.tx.Commit(ctx) }
func (p pgxTx) rollback(ctx context.Context) error { return p.tx.Rollback(ctx) }

// dollars rewrites ? placeholders as $1, $2, ...
func dollars(stmt string) string {
	var b strings.Builder
	n := 0
	for _, c := range stmt {
		if c == '?' {
			n++
			fmt.Fprintf(&b, "$%d", n)
			continue
		}
		b.WriteRune(c)
	}
	return b.String()
}

func pgFenceImpls(t *testing.T, dsn string) (viaSQL, viaPgx fenceImpl) {
	ctx := t.Context()
	db, err := sql.Open("pgx", dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = db.Close() })
	pool, err := pgxpool.New(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	sf, err := fence.Postgres(fence.DefaultTable)
	if err != nil {
		t.Fatal(err)
	}
	pf, err := NewPostgresFence("public." + fence.DefaultTable) // the same table, spelt another way
	if err != nil {
		t.Fatal(err)
	}
	if err := sf.CreateTable(ctx, db); err != nil {
		t.Fatal(err)
	}
	if err := pf.CreateTable(ctx, pool); err != nil { // exists: nothing to do
		t.Fatal(err)
	}
	for _, st := range []string{
		`CREATE TABLE fence_values (resource text PRIMARY KEY, token bigint NOT NULL, writes bigint NOT NULL)`,
		`CREATE TABLE fence_log (seq bigserial PRIMARY KEY, resource text NOT NULL, token bigint NOT NULL)`,
	} {
		if _, err := pool.Exec(ctx, st); err != nil {
			t.Fatal(err)
		}
	}
	one := func(ctx context.Context, stmt string, args ...any) (int64, error) {
		var n int64
		err := pool.QueryRow(ctx, dollars(stmt), args...).Scan(&n)
		return n, err
	}
	retry := func(err error) bool {
		var pe *pgconn.PgError
		return errors.As(err, &pe) && (pe.Code == "40001" || pe.Code == "40P01")
	}
	viaSQL = fenceImpl{
		name: "database/sql",
		begin: func(ctx context.Context) (fenceTx, error) {
			tx, err := db.BeginTx(ctx, nil)
			return sqlTx{f: sf, tx: tx, dollo: true}, err
		},
		closedTx: func(t *testing.T) fenceTx {
			tx, err := db.BeginTx(t.Context(), nil)
			if err != nil {
				t.Fatal(err)
			}
			_ = tx.Rollback()
			return sqlTx{f: sf, tx: tx, dollo: true}
		},
		one: one, retry: retry,
	}
	viaPgx = fenceImpl{
		name: "pgx",
		begin: func(ctx context.Context) (fenceTx, error) {
			tx, err := pool.Begin(ctx)
			return pgxTx{f: pf, tx: tx}, err
		},
		closedTx: func(t *testing.T) fenceTx {
			tx, err := pool.Begin(t.Context())
			if err != nil {
				t.Fatal(err)
			}
			_ = tx.Rollback(t.Context())
			return pgxTx{f: pf, tx: tx}
		},
		one: one, retry: retry,
	}
	return viaSQL, viaPgx
}

// TestPostgresFence runs the fence checks on PostgreSQL through
// database/sql (fence.Postgres) and pgx (PostgresFence), which share one
// table.
func TestPostgresFence(t *testing.T) {
	viaSQL, viaPgx := pgFenceImpls(t, postgresDSN(t))
	for _, impl := range []fenceImpl{viaSQL, viaPgx} {
		t.Run(impl.name, func(t *testing.T) { runFenceTests(t, impl) })
	}
	t.Run("SharedTable", func(t *testing.T) {
		// Checks through either implementation see each other's tokens.
		res := fenceResource(t)
		steps := []struct {
			impl    fenceImpl
			token   uint64
			highest uint64 // 0: accepted
		}{
			{viaSQL, 100, 0}, {viaPgx, 99, 100}, {viaPgx, 101, 0}, {viaSQL, 100, 101}, {viaSQL, 101, 0},
		}
		for i, s := range steps {
			err := fenceOnce(t, s.impl, res, s.token)
			if got := staleHighest(t, err); got != s.highest {
				t.Errorf("step %d (%s, token %d): %v; want highest %d (0: accepted)", i, s.impl.name, s.token, err, s.highest)
			}
		}
	})
	t.Run("BadInputPostgres", func(t *testing.T) {
		// What bigint and text do not hold, before any I/O.
		for _, impl := range []fenceImpl{viaSQL, viaPgx} {
			tx := impl.closedTx(t)
			for _, c := range []struct {
				resource string
				token    uint64
			}{{"r\x00", 1}, {"\xff", 1}, {"r", math.MaxInt64 + 1}} {
				if err := tx.check(t.Context(), c.resource, c.token); !errors.Is(err, distlock.ErrInvalid) {
					t.Errorf("%s: check(%q, %d) = %v; want ErrInvalid", impl.name, c.resource, c.token, err)
				}
			}
		}
	})
	t.Run("BadTableName", func(t *testing.T) {
		for _, name := range []string{"", "a.b.c", "1t", `t"`} {
			if f, err := NewPostgresFence(name); !errors.Is(err, distlock.ErrInvalid) || f != nil {
				t.Errorf("NewPostgresFence(%q) = %v, %v; want nil, ErrInvalid", name, f, err)
			}
		}
	})
}

// TestMariaDBFence runs the fence checks on MariaDB (fence.MySQL).
func TestMariaDBFence(t *testing.T) {
	ctx := t.Context()
	db, err := sql.Open("mysql", mariadbDSN(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = db.Close() })
	f, err := fence.MySQL(fence.DefaultTable)
	if err != nil {
		t.Fatal(err)
	}
	if err := f.CreateTable(ctx, db); err != nil {
		t.Fatal(err)
	}
	if err := f.CreateTable(ctx, db); err != nil { // exists: nothing to do
		t.Fatal(err)
	}
	for _, st := range []string{
		`CREATE TABLE fence_values (resource VARBINARY(255) PRIMARY KEY, token BIGINT UNSIGNED NOT NULL, writes BIGINT NOT NULL) ENGINE=InnoDB`,
		`CREATE TABLE fence_log (seq BIGINT AUTO_INCREMENT PRIMARY KEY, resource VARBINARY(255) NOT NULL, token BIGINT UNSIGNED NOT NULL) ENGINE=InnoDB`,
	} {
		if _, err := db.ExecContext(ctx, st); err != nil {
			t.Fatal(err)
		}
	}
	impl := fenceImpl{
		name: "database/sql",
		begin: func(ctx context.Context) (fenceTx, error) {
			tx, err := db.BeginTx(ctx, nil)
			return sqlTx{f: f, tx: tx}, err
		},
		closedTx: func(t *testing.T) fenceTx {
			tx, err := db.BeginTx(t.Context(), nil)
			if err != nil {
				t.Fatal(err)
			}
			_ = tx.Rollback()
			return sqlTx{f: f, tx: tx}
		},
		one: func(ctx context.Context, stmt string, args ...any) (int64, error) {
			var n int64
			err := db.QueryRowContext(ctx, stmt, args...).Scan(&n)
			return n, err
		},
		retry: func(err error) bool {
			var me *mysql.MySQLError
			return errors.As(err, &me) && (me.Number == 1213 || me.Number == 1205)
		},
	}
	runFenceTests(t, impl)
	t.Run("TokensAboveInt64", func(t *testing.T) {
		// BIGINT UNSIGNED holds every token; LAST_INSERT_ID carries it back.
		res := fenceResource(t)
		const big = uint64(math.MaxInt64) + 5
		for i, s := range []struct{ token, highest uint64 }{{big, 0}, {big - 1, big}, {big, 0}, {math.MaxUint64, 0}, {big, math.MaxUint64}} {
			if got := staleHighest(t, fenceOnce(t, impl, res, s.token)); got != s.highest {
				t.Errorf("step %d: token %d: highest %d; want %d (0: accepted)", i, s.token, got, s.highest)
			}
		}
	})
	t.Run("LastInsertIDOfTheSession", func(t *testing.T) {
		// A LAST_INSERT_ID the session set before does not leak into
		// the check's result: a new resource's first check passes.
		res := fenceResource(t)
		tx, err := impl.begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer tx.rollback(ctx)
		if err := tx.exec(ctx, "SELECT LAST_INSERT_ID(?)", uint64(1)<<40); err != nil {
			t.Fatal(err)
		}
		if err := tx.check(ctx, res, 3); err != nil {
			t.Errorf("first check after SELECT LAST_INSERT_ID(2^40) = %v; want nil", err)
		}
	})
}

// fenceResource is a resource name no other test uses.
func fenceResource(t *testing.T) string {
	return fmt.Sprintf("%s-%d", t.Name(), rand.Int64())
}

// fenceOnce checks token for resource in a transaction of its own and
// commits it when the check passes.
func fenceOnce(t *testing.T, impl fenceImpl, resource string, token uint64) error {
	t.Helper()
	ctx := t.Context()
	tx, err := impl.begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := tx.check(ctx, resource, token); err != nil {
		_ = tx.rollback(ctx)
		return err
	}
	if err := tx.commit(ctx); err != nil {
		t.Fatal(err)
	}
	return nil
}

// staleHighest returns the highest token of a StaleError, 0 for nil, and
// fails t for any other error.
func staleHighest(t *testing.T, err error) uint64 {
	t.Helper()
	var se *fence.StaleError
	switch {
	case err == nil:
		return 0
	case errors.As(err, &se) && errors.Is(err, fence.ErrStale) && se.Highest > se.Token:
		return se.Highest
	}
	t.Fatalf("check: %v; want nil or a StaleError", err)
	return 0
}

func runFenceTests(t *testing.T, impl fenceImpl) {
	t.Run("ConcurrentWriters", func(t *testing.T) { testFenceConcurrent(t, impl) })
	t.Run("FailedCheckLeavesNothing", func(t *testing.T) { testFenceFailedCheck(t, impl) })
	t.Run("EqualTokensPass", func(t *testing.T) { testFenceEqual(t, impl) })
	t.Run("BadInputNoIO", func(t *testing.T) { testFenceBadInput(t, impl) })
}

// testFenceConcurrent: goroutines write one resource in transactions
// with interleaved tokens (a shared counter, each token drawn 0-3 below
// it). Each transaction checks, then updates the resource's value row
// and appends to a log; one in ten gives up after its check and rolls
// back. Then: every refusal is a StaleError with a higher token; a token
// below one committed before its transaction began is never accepted;
// the log, in commit order, never goes down; the value row holds the
// highest committed token, written once per committed transaction; a
// rolled-back check left no trace.
func testFenceConcurrent(t *testing.T, impl fenceImpl) {
	const workers, rounds = 8, 60
	ctx := t.Context()
	res := fenceResource(t)
	tx, err := impl.begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := tx.exec(ctx, "INSERT INTO fence_values (resource, token, writes) VALUES (?, 0, 0)", res); err != nil {
		t.Fatal(err)
	}
	if err := tx.commit(ctx); err != nil {
		t.Fatal(err)
	}
	var next, committed, highestGivenUp atomic.Uint64
	var commits, refusals, givenUp, retries atomic.Int64
	var wg sync.WaitGroup
	for w := range workers {
		wg.Go(func() {
			rnd := rand.New(rand.NewPCG(34, uint64(w)))
			for range rounds {
				tok := max(next.Add(1), 4) - uint64(rnd.IntN(4))
				giveUp := rnd.IntN(10) == 0
				for attempt := 0; ; attempt++ {
					floor := committed.Load()
					err := fenceWrite(ctx, impl, res, tok, giveUp)
					var se *fence.StaleError
					switch {
					case err == nil && giveUp:
						givenUp.Add(1)
						raiseTo(&highestGivenUp, tok)
					case err == nil:
						if tok < floor {
							t.Errorf("token %d accepted after %d had committed", tok, floor)
						}
						commits.Add(1)
						raiseTo(&committed, tok)
					case errors.As(err, &se):
						refusals.Add(1)
						if se.Highest <= tok || se.Token != tok || se.Resource != res {
							t.Errorf("refusal of %d: %+v", tok, se)
						}
					case impl.retry(err) && attempt < 20:
						retries.Add(1)
						continue
					default:
						t.Errorf("token %d: %v", tok, err)
					}
					break
				}
			}
		})
	}
	wg.Wait()
	t.Logf("%d committed, %d refused, %d given up, %d reruns after a deadlock or serialization failure",
		commits.Load(), refusals.Load(), givenUp.Load(), retries.Load())
	if refusals.Load() == 0 || commits.Load() == 0 {
		t.Fatalf("%d committed, %d refused: the tokens did not interleave", commits.Load(), refusals.Load())
	}
	high := committed.Load()
	if v, err := impl.one(ctx, "SELECT token FROM fence_values WHERE resource = ?", res); err != nil || uint64(v) != high {
		t.Errorf("value row's token = %d, %v; want %d, the highest committed", v, err, high)
	}
	if n, err := impl.one(ctx, "SELECT writes FROM fence_values WHERE resource = ?", res); err != nil || n != commits.Load() {
		t.Errorf("value row written %d times, %v; want %d", n, err, commits.Load())
	}
	if n, err := impl.one(ctx, "SELECT COUNT(*) FROM fence_log WHERE resource = ?", res); err != nil || n != commits.Load() {
		t.Errorf("%d log rows, %v; want %d", n, err, commits.Load())
	}
	// The log in commit order: a row whose token is below the previous
	// row's would be an older holder's write after a newer one's.
	if n, err := impl.one(ctx, `SELECT COUNT(*) FROM fence_log a JOIN fence_log b
  ON b.resource = a.resource AND b.seq > a.seq AND b.token < a.token WHERE a.resource = ?`, res); err != nil || n != 0 {
		t.Errorf("%d log rows below an earlier row, %v; want 0", n, err)
	}
	// The fence holds the highest committed token: it passes, and one
	// below it (never a given-up token above it) is refused.
	if g := highestGivenUp.Load(); g > high {
		if err := fenceOnce(t, impl, res, high+1); err != nil {
			t.Errorf("token %d above the highest committed %d (a rolled-back check had %d) = %v; want accepted", high+1, high, g, err)
		}
		high++
	}
	if got := staleHighest(t, fenceOnce(t, impl, res, high-1)); got != high {
		t.Errorf("token %d: highest %d; want %d", high-1, got, high)
	}
}

// fenceWrite checks token for resource in a transaction that then writes
// the value row and the log, and commits, or rolls back if giveUp.
func fenceWrite(ctx context.Context, impl fenceImpl, resource string, token uint64, giveUp bool) (err error) {
	tx, err := impl.begin(ctx)
	if err != nil {
		return err
	}
	defer func() {
		if err != nil || giveUp {
			_ = tx.rollback(ctx)
		}
	}()
	if err := tx.check(ctx, resource, token); err != nil {
		return err
	}
	if err := tx.exec(ctx, "UPDATE fence_values SET token = ?, writes = writes + 1 WHERE resource = ?", token, resource); err != nil {
		return err
	}
	if err := tx.exec(ctx, "INSERT INTO fence_log (resource, token) VALUES (?, ?)", resource, token); err != nil {
		return err
	}
	if giveUp {
		return nil
	}
	return tx.commit(ctx)
}

// testFenceFailedCheck: a transaction that wrote, then failed its check
// and rolled back, leaves none of its writes; a transaction whose check
// passed and that rolled back leaves no token behind.
func testFenceFailedCheck(t *testing.T, impl fenceImpl) {
	ctx := t.Context()
	res := fenceResource(t)
	if err := fenceOnce(t, impl, res, 10); err != nil {
		t.Fatal(err)
	}
	tx, err := impl.begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := tx.exec(ctx, "INSERT INTO fence_values (resource, token, writes) VALUES (?, 9, 1)", res); err != nil {
		t.Fatal(err)
	}
	if got := staleHighest(t, tx.check(ctx, res, 9)); got != 10 {
		t.Errorf("check of 9 after 10: highest %d; want 10", got)
	}
	if err := tx.rollback(ctx); err != nil {
		t.Fatal(err)
	}
	if n, err := impl.one(ctx, "SELECT COUNT(*) FROM fence_values WHERE resource = ?", res); err != nil || n != 0 {
		t.Errorf("the refused transaction's row: %d, %v; want none", n, err)
	}
	// Passed, then rolled back: token 20 was never recorded.
	tx, err = impl.begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := tx.check(ctx, res, 20); err != nil {
		t.Fatal(err)
	}
	if err := tx.rollback(ctx); err != nil {
		t.Fatal(err)
	}
	if err := fenceOnce(t, impl, res, 11); err != nil {
		t.Errorf("token 11 after a rolled-back check of 20 = %v; want accepted", err)
	}
}

// testFenceEqual: the same token passes again, in one transaction and in
// the next, and resources have tokens of their own.
func testFenceEqual(t *testing.T, impl fenceImpl) {
	ctx := t.Context()
	res, other := fenceResource(t), fenceResource(t)
	if err := fenceOnce(t, impl, res, 7); err != nil {
		t.Fatal(err)
	}
	tx, err := impl.begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.rollback(ctx)
	for i := range 2 {
		if err := tx.check(ctx, res, 7); err != nil {
			t.Errorf("check %d of the same token 7 = %v; want nil", i, err)
		}
	}
	if err := tx.check(ctx, other, 1); err != nil {
		t.Errorf("another resource's token 1 = %v; want nil", err)
	}
	if err := tx.commit(ctx); err != nil {
		t.Fatal(err)
	}
	if err := fenceOnce(t, impl, res, 7); err != nil {
		t.Errorf("token 7 once more = %v; want nil", err)
	}
}

// testFenceBadInput: bad input is ErrInvalid, found before any I/O: the
// transaction given has been rolled back, so any statement would fail
// with another error.
func testFenceBadInput(t *testing.T, impl fenceImpl) {
	tx := impl.closedTx(t)
	ctx := t.Context()
	for _, c := range []struct {
		resource string
		token    uint64
	}{
		{"", 1}, {"r", 0}, {strings.Repeat("r", fence.MaxResourceLen+1), 1},
	} {
		if err := tx.check(ctx, c.resource, c.token); !errors.Is(err, distlock.ErrInvalid) {
			t.Errorf("check(%.12q, %d) = %v; want ErrInvalid", c.resource, c.token, err)
		}
	}
	// And a good check on that transaction does reach the driver.
	if err := tx.check(ctx, "r", 1); err == nil || errors.Is(err, distlock.ErrInvalid) {
		t.Errorf("check on a rolled-back transaction = %v; want the driver's error", err)
	}
}

// raiseTo makes a hold v if v is larger than what it holds.
func raiseTo(a *atomic.Uint64, v uint64) {
	for h := a.Load(); v > h && !a.CompareAndSwap(h, v); h = a.Load() {
	}
}
