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
			// The table exists once a worker has made its resource.
			rows, err := pool.Query(ctx, "SELECT owner FROM "+sqldb.DefaultTable+" WHERE lock_key = $1", key)
			if err != nil {
				return nil, err
			}
			defer rows.Close()
			return sqlRows(key, rows.Scan, rows.Next, rows.Err)
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
			defer rows.Close()
			return sqlRows(key, rows.Scan, rows.Next, rows.Err)
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
