package safety

import (
	"context"
	"database/sql"
	"net/url"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/distlock/distlock/internal/testserver"
	"github.com/distlock/distlock/safety/harness"
	"github.com/distlock/distlock/sqldb"
)

const sqlTTL = 500 * time.Millisecond

// sqlRows lists "key=owner" for the rows query returns.
func sqlRows(key string, scan func(dest ...any) error, next func() bool, err func() error) ([]string, error) {
	var out []string
	for next() {
		var o string
		if err := scan(&o); err != nil {
			return nil, err
		}
		out = append(out, key+"="+o)
	}
	return out, err()
}

func TestPostgres(t *testing.T) {
	srv := testserver.Postgres(t)
	tg := pgTarget(t, srv)
	t.Run("NoFault", func(t *testing.T) { testNoFault(t, tg) })
	t.Run("HolderPause", func(t *testing.T) { testHolderPause(t, tg) })
	t.Run("ServerKillRestart", func(t *testing.T) { testSQLServerKill(t, tg, srv) })
	t.Run("CancelStorm", func(t *testing.T) { testCancelStorm(t, tg) })
	t.Run("TableSpellings", func(t *testing.T) { testPGTableSpellings(t, tg, srv) })
	t.Run("StalledTable", func(t *testing.T) { testStalledTable(t, tg, pgStall(t, srv.DSN)) })
	t.Run("SemaphorePause", func(t *testing.T) { testSemaphorePause(t, tg) })
	t.Run("RWMutexPause", func(t *testing.T) { testRWPause(t, tg) })
}

func pgTarget(t testing.TB, srv *testserver.PostgresServer) target {
	pool, err := pgxpool.New(t.Context(), srv.DSN)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	u, err := url.Parse(srv.DSN)
	if err != nil {
		t.Fatal(err)
	}
	return target{
		// The workers' fenced writes go to a PostgreSQL of their own,
		// guarded by fence.Postgres: a resource apart from the lock
		// service, which the lock server's faults do not touch.
		fence:   harness.Fence{Kind: "postgres", Addr: testserver.Postgres(t).DSN},
		name:    "postgres",
		backend: harness.Backend{Kind: "postgres", Addrs: []string{srv.DSN}, Timeout: 2 * time.Second},
		server:  u.Host,
		via: func(hp string) harness.Backend {
			v := *u
			v.Host = hp
			return harness.Backend{Kind: "postgres", Addrs: []string{v.String()}, Timeout: 2 * time.Second}
		},
		ttl:    sqlTTL,
		expiry: sqlTTL,
		hold:   100 * time.Millisecond,
		leftovers: func(ctx context.Context, key string) ([]string, error) {
			// The tables exist once a worker has made its resource.
			// Every row of the key: its mutex's, and its semaphore's or
			// read/write lock's in the kinds table.
			rows, err := pool.Query(ctx, "SELECT owner FROM "+sqldb.DefaultTable+" WHERE lock_key = $1", key)
			if err != nil {
				return nil, err
			}
			out, err := sqlRows(key, rows.Scan, rows.Next, rows.Err)
			rows.Close()
			if err != nil {
				return nil, err
			}
			rows, err = pool.Query(ctx, "SELECT kind::text || ' ' || coalesce(state::text, owner) FROM "+sqldb.DefaultTable+"_kinds WHERE lock_key = $1", []byte(key))
			if err != nil {
				return nil, err
			}
			defer rows.Close()
			kinds, err := sqlRows(key, rows.Scan, rows.Next, rows.Err)
			return append(out, kinds...), err
		},
	}
}

func TestMariaDB(t *testing.T) {
	srv := testserver.MariaDB(t)
	tg := mariaTarget(t, srv)
	t.Run("NoFault", func(t *testing.T) { testNoFault(t, tg) })
	t.Run("HolderPause", func(t *testing.T) { testHolderPause(t, tg) })
	t.Run("ServerKillRestart", func(t *testing.T) { testSQLServerKill(t, tg, srv) })
	t.Run("CancelStorm", func(t *testing.T) { testCancelStorm(t, tg) })
	t.Run("StalledTable", func(t *testing.T) {
		db, err := sql.Open("mysql", srv.DSN)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = db.Close() })
		testStalledTable(t, tg, mariaStall(t, db))
	})
	t.Run("SemaphorePause", func(t *testing.T) { testSemaphorePause(t, tg) })
	t.Run("RWMutexPause", func(t *testing.T) { testRWPause(t, tg) })
}

func mariaTarget(t testing.TB, srv *testserver.MariaDBServer) target {
	db, err := sql.Open("mysql", srv.DSN)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = db.Close() })
	cfg, err := mysql.ParseDSN(srv.DSN)
	if err != nil {
		t.Fatal(err)
	}
	return target{
		name:    "mysql (MariaDB)",
		backend: harness.Backend{Kind: "mysql", Addrs: []string{srv.DSN}, Timeout: 2 * time.Second},
		server:  cfg.Addr,
		via: func(hp string) harness.Backend {
			c := cfg.Clone()
			c.Addr = hp
			return harness.Backend{Kind: "mysql", Addrs: []string{c.FormatDSN()}, Timeout: 2 * time.Second}
		},
		ttl:    sqlTTL,
		expiry: sqlTTL,
		hold:   100 * time.Millisecond,
		leftovers: func(ctx context.Context, key string) ([]string, error) {
			rows, err := db.QueryContext(ctx, "SELECT owner FROM "+sqldb.DefaultTable+" WHERE lock_key = ?", key)
			if err != nil {
				return nil, err
			}
			out, err := sqlRows(key, rows.Scan, rows.Next, rows.Err)
			rows.Close()
			if err != nil {
				return nil, err
			}
			// The kinds table's rows of the key (its counters, kind 0,
			// are keyed by bucket).
			rows, err = db.QueryContext(ctx, "SELECT CONCAT(kind, ' ', state) FROM "+sqldb.DefaultTable+"_kinds WHERE lock_key = ? AND kind <> 0", key)
			if err != nil {
				return nil, err
			}
			defer rows.Close()
			kinds, err := sqlRows(key, rows.Scan, rows.Next, rows.Err)
			return append(out, kinds...), err
		},
	}
}

// testSQLServerKill kills the database server (SIGKILL) in the middle of
// a mix and starts it again on its data: it recovers from its log, with
// the lock rows and the token counter as committed.
func testSQLServerKill(t *testing.T, tg target, srv interface {
	Kill()
	Start()
}) {
	r := harness.NewRun(t)
	key := uniqueKey(t)
	ws := startMix(r, tg, key, 3)
	waitAcquisitions(t, tg, 10*soak, ws...)
	r.Note("SIGKILL server")
	srv.Kill()
	srv.Start()
	upAt := r.Note("server restarted")
	waitAcquisitions(t, tg, 10*soak, ws...)
	stopAll(t, tg, ws...)

	evs := r.History()
	res := harness.Check(t, tg.name, "server SIGKILL + restart", evs)
	res.Orphans = orphans(t, tg, key)
	if first, ok := firstAcquisitionAfter(evs, upAt); ok {
		res.Recovery = time.Duration(first.Return - upAt)
	}
	res.Notes = "recovery from the restart"
	res.Log(t)
	assertSafe(t, res)
	assertNoOverlap(t, res)
	if res.Orphans != 0 {
		t.Errorf("%d orphans; want 0", res.Orphans)
	}
}

// testPGTableSpellings runs workers that name one table two ways, "t" and
// "public.t", while a trigger delays every acquire 0-200ms between its
// token draw and its commit (a server-side stall, as a slow disk or a
// descheduled backend would make it). The draws of one key must still be
// ordered by commit across spellings: a worker that drew a token, stalled,
// and committed after another spelling's holder came and went would hold
// the lock with a smaller token than that holder (as it would if the
// ordering lock were keyed by the name as written: the two spellings
// would not queue on one lock).
func testPGTableSpellings(t *testing.T, tg target, srv *testserver.PostgresServer) {
	const table = "spell_locks"
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	pool, err := pgxpool.New(ctx, srv.DSN)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	res0, err := sqldb.NewPostgres(ctx, pool, sqldb.WithTable(table)) // creates the table
	if err != nil {
		t.Fatal(err)
	}
	_ = res0.Close()
	if _, err := pool.Exec(ctx, `CREATE OR REPLACE FUNCTION spell_delay() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  PERFORM pg_sleep(random() * 0.2);
  RETURN NEW;
END $$;
DROP TRIGGER IF EXISTS delay ON `+table+`;
CREATE TRIGGER delay BEFORE INSERT ON `+table+` FOR EACH ROW EXECUTE FUNCTION spell_delay()`); err != nil {
		t.Fatalf("create the delaying trigger: %v", err)
	}

	r := harness.NewRun(t)
	key := uniqueKey(t)
	var ws []*harness.Worker
	for i, spelling := range []string{table, "public." + table, table, "public." + table} {
		cfg := mixConfig(tg, key, i)
		cfg.Backend.Table = spelling
		cfg.Hold, cfg.Think = 50*time.Millisecond, 10*time.Millisecond
		ws = append(ws, r.Worker(cfg))
	}
	waitAcquisitions(t, tg, 20*soak, ws...)
	stopAll(t, tg, ws...)
	res := harness.Check(t, tg.name, "workers spell the table two ways (t, public.t); acquires stalled 0-200ms between token draw and commit", r.History())
	var left int
	if err := pool.QueryRow(context.Background(), `SELECT count(*) FROM `+table+` WHERE lock_key = $1`, key).Scan(&left); err != nil {
		t.Fatal(err)
	}
	res.Orphans = left
	res.Notes = "2 workers per spelling; a write refused here (no overlap, no zombie) would mean a token below the previous holder's"
	res.Log(t)
	assertSafe(t, res)
	assertNoOverlap(t, res)
	// TokenOrder compares an acquisition only with those that returned
	// before it began; an acquire that stalled after its draw began
	// earlier. The fenced register sees the order of holders itself.
	if res.Rejected != 0 {
		t.Errorf("%d writes refused without overlap or zombie: tokens went backwards between successive holders", res.Rejected)
	}
	if res.Orphans != 0 {
		t.Errorf("%d orphans; want 0", res.Orphans)
	}
}
