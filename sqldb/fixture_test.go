package sqldb

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"net"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/distlock/distlock/backend"
	"github.com/distlock/distlock/internal/testserver/proxy"
	"github.com/distlock/distlock/testsuite"
)

// resource is what both backends are, for tests that run on both.
type resource interface {
	backend.Spinner
	backend.Refresher
	backend.KeyValidator
	Close() error
}

// fixture is one database shared by a top-level test's subtests, and the
// means to make resources over it as separate processes would have them.
type fixture struct {
	name string
	// newResource returns a resource over its own pool or *sql.DB, both
	// closed when t ends.
	newResource func(t testing.TB) resource
	// rows lists "owner" for every row of key (live or expired).
	rows func(ctx context.Context, key string) ([]string, error)
	// evict deletes key's row behind its owner's back.
	evict func(ctx context.Context, key string) error
	// requests counts the holders and live queued intents of key (nil:
	// the store keeps no queue; see testsuite.Harness.Requests).
	requests func(ctx context.Context, key string, kind backend.Kind) (int, error)
	// remaining is the time key's row has left by the server's clock
	// (negative once expired).
	remaining func(ctx context.Context, key string) (time.Duration, error)
	// unit counts key length as the lock_key column does.
	unit keyUnit
	// inZone returns a resource whose sessions run in time zone tz
	// (a UTC offset such as "+13:00").
	inZone func(t testing.TB, tz string) resource
	// killable returns a resource over a client with one connection, and
	// a func that kills that connection on the server.
	killable func(t testing.TB) (resource, func())
	// closed returns a resource whose client is closed: any I/O fails.
	closed func(t testing.TB) resource
	// refused returns a resource whose client's connections are closed
	// and whose dials from then on go to an address that refuses them.
	refused func(t testing.TB) resource
	// stall makes acquire statements of key wait on the server, on a lock
	// an admin session holds, until release; waiting polls whether one
	// is waiting there now.
	stall func(t testing.TB, key string) (waiting func() (bool, error), release func())

	// newResourceWith returns a resource made with opts over its own
	// pool or *sql.DB.
	newResourceWith func(t testing.TB, opts ...Option) resource
	// lockTable has another session lock table (PostgreSQL: LOCK TABLE
	// in a transaction; MariaDB: LOCK TABLES ... WRITE) until resume,
	// which t's cleanup calls too; a second call does nothing.
	lockTable func(t testing.TB, table string) (resume func())
	// acquiresWaiting counts the acquire statements on table that the
	// server is running now.
	acquiresWaiting func(ctx context.Context, table string) (int, error)
	// audit starts counting the acquire statements on keys of table
	// that commit, and returns the count so far. PostgreSQL: a trigger
	// records every lock row written. MariaDB: the keys' fencing
	// counters, which every acquire statement that commits bumps once
	// (a trigger with a statement in it would lose the acquire's
	// LAST_INSERT_ID); counters shared with other keys count theirs too.
	audit func(t testing.TB, table string, keys ...string) (commits func(ctx context.Context) (int, error))
	// rowsIn is rows for table.
	rowsIn func(ctx context.Context, table, key string) ([]string, error)
}

// stallHarness is the Harness.Stall of the conformance suite: another
// session locks the lock table.
func (f fixture) stallHarness(t *testing.T) (resume func()) { return f.lockTable(t, DefaultTable) }

// refusingDialer dials the server until on is set, and from then on an
// address where nothing listens, whose dials the kernel refuses.
type refusingDialer struct {
	on   atomic.Bool
	once sync.Once
	addr string
}

func (d *refusingDialer) dial(t testing.TB, ctx context.Context, network, addr string) (net.Conn, error) {
	if d.on.Load() {
		d.once.Do(func() { d.addr = testsuite.RefusingAddr(t) })
		addr = d.addr
	}
	var nd net.Dialer
	return nd.DialContext(ctx, network, addr)
}

// once makes fn safe to call twice and registers it with t's cleanup.
func once(t testing.TB, fn func()) func() {
	var o sync.Once
	do := func() { o.Do(fn) }
	t.Cleanup(do)
	return do
}

// scanOwners lists "row owned by o" for each o the scan yields.
func scanOwners(next func() bool, scan func(...any) error, rowsErr func() error) ([]string, error) {
	var out []string
	for next() {
		var o string
		if err := scan(&o); err != nil {
			return nil, err
		}
		out = append(out, "row owned by "+o)
	}
	return out, rowsErr()
}

// pgFixture is a PostgreSQL database for one top-level test.
type pgFixture struct {
	dsn   string
	admin *pgxpool.Pool
}

func newPG(t testing.TB) *pgFixture {
	t.Helper()
	f := &pgFixture{dsn: postgresDSN(t)}
	f.admin = f.pool(t, nil)
	return f
}

// pool returns a new pool over the database, closed when t ends; tweak may
// change its config first.
func (f *pgFixture) pool(t testing.TB, tweak func(*pgxpool.Config)) *pgxpool.Pool {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(f.dsn)
	if err != nil {
		t.Fatalf("pgxpool.ParseConfig: %v", err)
	}
	if tweak != nil {
		tweak(cfg)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	p, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatalf("pgxpool.NewWithConfig: %v", err)
	}
	t.Cleanup(p.Close)
	return p
}

// proxiedPool returns a new pool whose connections go through a proxy of
// their own (to hold back or delay the server's bytes), closed when t
// ends; tweak may change the pool's config first.
func (f *pgFixture) proxiedPool(t testing.TB, tweak func(*pgxpool.Config)) (*pgxpool.Pool, *proxy.Proxy) {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(f.dsn)
	if err != nil {
		t.Fatal(err)
	}
	px, err := proxy.Start(net.JoinHostPort(cfg.ConnConfig.Host, strconv.Itoa(int(cfg.ConnConfig.Port))))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = px.Close() })
	_, port, _ := net.SplitHostPort(px.Addr)
	pool := f.pool(t, func(c *pgxpool.Config) {
		c.ConnConfig.Host = "127.0.0.1"
		p, _ := strconv.Atoi(port)
		c.ConnConfig.Port = uint16(p)
		c.ConnConfig.Fallbacks = nil
		if tweak != nil {
			tweak(c)
		}
	})
	return pool, px
}

// warmPool makes pool hold at least n connections, idle.
func warmPool(t testing.TB, pool *pgxpool.Pool, n int) {
	t.Helper()
	cs := make([]*pgxpool.Conn, 0, n)
	defer func() {
		for _, c := range cs {
			c.Release()
		}
	}()
	for range n {
		c, err := pool.Acquire(t.Context())
		if err != nil {
			t.Fatal(err)
		}
		cs = append(cs, c)
	}
}

// resource returns a Postgres over pool, closed when t ends (before pool:
// cleanups run last-in first-out).
func (f *pgFixture) resource(t testing.TB, pool *pgxpool.Pool, opts ...Option) *Postgres {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	p, err := NewPostgres(ctx, pool, opts...)
	if err != nil {
		t.Fatalf("NewPostgres: %v", err)
	}
	t.Cleanup(func() {
		if err := p.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
	})
	return p
}

func (f *pgFixture) fixture() fixture {
	return fixture{
		name:     "postgres",
		requests: f.requests,
		newResource: func(t testing.TB) resource {
			// A running application's pool has connections to
			// spare; a pool that has made one only (the suite's,
			// fresh) makes the next in ~100ms under -race, past the
			// facade's bound on a withdrawal (50ms), which
			// CancelledHeadLeaves checks.
			return f.resource(t, f.pool(t, func(c *pgxpool.Config) { c.MinConns = 2 }))
		},
		rows: func(ctx context.Context, key string) ([]string, error) {
			var out []string
			if textKey(key) {
				rows, err := f.admin.Query(ctx, `SELECT owner FROM distlock_locks WHERE lock_key = $1`, key)
				if err != nil {
					return nil, err
				}
				out, err = scanOwners(rows.Next, rows.Scan, rows.Err)
				rows.Close()
				if err != nil {
					return nil, err
				}
			}
			rows, err := f.admin.Query(ctx, `SELECT kind, owner, state FROM distlock_locks_kinds WHERE lock_key = $1`, []byte(key))
			if err != nil {
				return nil, err
			}
			defer rows.Close()
			for rows.Next() {
				var (
					kind  int16
					owner string
					state []byte
				)
				if err := rows.Scan(&kind, &owner, &state); err != nil {
					return nil, err
				}
				kr, err := kindRows(int(kind), owner, state)
				if err != nil {
					return nil, err
				}
				out = append(out, kr...)
			}
			return out, rows.Err()
		},
		evict: func(ctx context.Context, key string) error {
			if _, err := f.admin.Exec(ctx, `DELETE FROM distlock_locks_kinds WHERE lock_key = $1`, []byte(key)); err != nil {
				return err
			}
			_, err := f.admin.Exec(ctx, `DELETE FROM distlock_locks WHERE lock_key = $1`, key)
			return err
		},
		remaining: func(ctx context.Context, key string) (time.Duration, error) {
			var us int64
			err := f.admin.QueryRow(ctx, `SELECT (extract(epoch FROM expires_at - now()) * 1000000)::bigint FROM distlock_locks WHERE lock_key = $1`, key).Scan(&us)
			return time.Duration(us) * time.Microsecond, err
		},
		unit: unitChars,
		inZone: func(t testing.TB, tz string) resource {
			return f.resource(t, f.pool(t, func(c *pgxpool.Config) {
				c.ConnConfig.RuntimeParams["timezone"] = tz
			}))
		},
		killable: func(t testing.TB) (resource, func()) {
			pool := f.pool(t, func(c *pgxpool.Config) { c.MaxConns = 1 })
			r := f.resource(t, pool)
			var pid int32
			if err := pool.QueryRow(context.Background(), `SELECT pg_backend_pid()`).Scan(&pid); err != nil {
				t.Fatalf("pg_backend_pid: %v", err)
			}
			return r, func() {
				var ok bool
				if err := f.admin.QueryRow(context.Background(), `SELECT pg_terminate_backend($1)`, pid).Scan(&ok); err != nil || !ok {
					t.Fatalf("pg_terminate_backend(%d) = %v, %v", pid, ok, err)
				}
			}
		},
		closed: func(t testing.TB) resource {
			pool := f.pool(t, nil)
			r := f.resource(t, pool)
			pool.Close()
			return r
		},
		refused: func(t testing.TB) resource {
			var refuse refusingDialer
			pool := f.pool(t, func(c *pgxpool.Config) {
				c.ConnConfig.DialFunc = func(ctx context.Context, network, addr string) (net.Conn, error) {
					return refuse.dial(t, ctx, network, addr)
				}
			})
			r := f.resource(t, pool)
			refuse.on.Store(true)
			pool.Reset() // the next acquire dials
			return r
		},
		stall: func(t testing.TB, key string) (func() (bool, error), func()) {
			// The session-level form of the advisory lock every acquire
			// of key takes first.
			ctx := context.Background()
			c, err := f.admin.Acquire(ctx)
			if err != nil {
				t.Fatal(err)
			}
			var oid uint32
			if err := f.admin.QueryRow(ctx, `SELECT to_regclass($1)::oid`, DefaultTable).Scan(&oid); err != nil {
				c.Release()
				t.Fatalf("the table's oid: %v", err)
			}
			class := int32(oid)
			if _, err := c.Exec(ctx, `SELECT pg_advisory_lock($1::int4, hashtext($2::text))`, class, key); err != nil {
				c.Release()
				t.Fatalf("pg_advisory_lock: %v", err)
			}
			waiting := func() (bool, error) {
				var n int
				err := f.admin.QueryRow(ctx, `SELECT count(*) FROM pg_locks
WHERE locktype = 'advisory' AND NOT granted AND classid = $1::int4::oid AND objid = hashtext($2::text)::oid`,
					int32(class), key).Scan(&n)
				return n > 0, err
			}
			return waiting, func() {
				defer c.Release()
				if _, err := c.Exec(ctx, `SELECT pg_advisory_unlock($1::int4, hashtext($2::text))`, class, key); err != nil {
					t.Errorf("pg_advisory_unlock: %v", err)
				}
			}
		},
		newResourceWith: func(t testing.TB, opts ...Option) resource {
			return f.resource(t, f.pool(t, nil), opts...)
		},
		lockTable: func(t testing.TB, table string) func() {
			ctx := context.Background()
			tx, err := f.admin.Begin(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := tx.Exec(ctx, `LOCK TABLE `+table+` IN ACCESS EXCLUSIVE MODE`); err != nil {
				tx.Rollback(ctx)
				t.Fatalf("LOCK TABLE %s: %v", table, err)
			}
			return once(t, func() {
				if err := tx.Rollback(ctx); err != nil {
					t.Errorf("unlock table %s: %v", table, err)
				}
			})
		},
		acquiresWaiting: func(ctx context.Context, table string) (int, error) {
			var n int
			err := f.admin.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity
WHERE state = 'active' AND pid <> pg_backend_pid() AND query LIKE 'INSERT INTO "public"."' || $1 || '"%'`, table).Scan(&n)
			return n, err
		},
		audit: func(t testing.TB, table string, keys ...string) func(ctx context.Context) (int, error) {
			ctx := context.Background()
			if _, err := f.admin.Exec(ctx, `CREATE TABLE audit_`+table+` (lock_key text NOT NULL);
CREATE FUNCTION audit_`+table+`() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  INSERT INTO audit_`+table+` VALUES (NEW.lock_key);
  RETURN NEW;
END $$;
CREATE TRIGGER audit AFTER INSERT OR UPDATE ON `+table+` FOR EACH ROW EXECUTE FUNCTION audit_`+table+`()`); err != nil {
				t.Fatalf("audit %s: %v", table, err)
			}
			return func(ctx context.Context) (int, error) {
				var n int
				err := f.admin.QueryRow(ctx, `SELECT count(*) FROM audit_`+table+` WHERE lock_key = ANY($1)`, keys).Scan(&n)
				return n, err
			}
		},
		rowsIn: func(ctx context.Context, table, key string) ([]string, error) {
			rows, err := f.admin.Query(ctx, `SELECT owner FROM `+table+` WHERE lock_key = $1`, key)
			if err != nil {
				return nil, err
			}
			defer rows.Close()
			return scanOwners(rows.Next, rows.Scan, rows.Err)
		},
	}
}

// myFixture is a MariaDB database for one top-level test.
type myFixture struct {
	dsn   string
	admin *sql.DB
}

func newMy(t testing.TB) *myFixture {
	t.Helper()
	f := &myFixture{dsn: mariadbDSN(t)}
	f.admin = f.db(t, nil)
	return f
}

// db returns a new *sql.DB over the database, closed when t ends; tweak may
// change its config first.
func (f *myFixture) db(t testing.TB, tweak func(*mysql.Config)) *sql.DB {
	t.Helper()
	cfg, err := mysql.ParseDSN(f.dsn)
	if err != nil {
		t.Fatalf("mysql.ParseDSN: %v", err)
	}
	if tweak != nil {
		tweak(cfg)
	}
	conn, err := mysql.NewConnector(cfg)
	if err != nil {
		t.Fatalf("mysql.NewConnector: %v", err)
	}
	db := sql.OpenDB(conn)
	t.Cleanup(func() { db.Close() })
	return db
}

func (f *myFixture) resource(t testing.TB, db *sql.DB, opts ...Option) *MySQL {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	m, err := NewMySQL(ctx, db, opts...)
	if err != nil {
		t.Fatalf("NewMySQL: %v", err)
	}
	t.Cleanup(func() {
		if err := m.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
	})
	return m
}

func (f *myFixture) fixture() fixture {
	return fixture{
		name: "mariadb",
		newResource: func(t testing.TB) resource {
			return f.resource(t, f.db(t, nil))
		},
		requests: f.requests,
		rows: func(ctx context.Context, key string) ([]string, error) {
			rows, err := f.admin.QueryContext(ctx, "SELECT owner FROM distlock_locks WHERE lock_key = ?", key)
			if err != nil {
				return nil, err
			}
			out, err := scanOwners(rows.Next, rows.Scan, rows.Err)
			rows.Close()
			if err != nil {
				return nil, err
			}
			// The kinds table's rows of key (its counters are keyed by
			// bucket, kind 0).
			rows, err = f.admin.QueryContext(ctx, "SELECT kind, state FROM distlock_locks_kinds WHERE lock_key = ? AND kind <> 0", key)
			if err != nil {
				return nil, err
			}
			defer rows.Close()
			for rows.Next() {
				var (
					kind  int
					state []byte
				)
				if err := rows.Scan(&kind, &state); err != nil {
					return nil, err
				}
				kr, err := kindRows(kind, "", state)
				if err != nil {
					return nil, err
				}
				out = append(out, kr...)
			}
			return out, rows.Err()
		},
		evict: func(ctx context.Context, key string) error {
			if key == "" || strings.HasPrefix(key, counterPrefix) {
				return fmt.Errorf("evict: refusing to delete a counter row")
			}
			if _, err := f.admin.ExecContext(ctx, "DELETE FROM distlock_locks_kinds WHERE lock_key = ? AND kind <> 0", key); err != nil {
				return err
			}
			_, err := f.admin.ExecContext(ctx, "DELETE FROM distlock_locks WHERE lock_key = ?", key)
			return err
		},
		remaining: func(ctx context.Context, key string) (time.Duration, error) {
			var us int64
			err := f.admin.QueryRowContext(ctx, "SELECT TIMESTAMPDIFF(MICROSECOND, UTC_TIMESTAMP(6), expires_at) FROM distlock_locks WHERE lock_key = ?", key).Scan(&us)
			return time.Duration(us) * time.Microsecond, err
		},
		unit: unitBytes,
		inZone: func(t testing.TB, tz string) resource {
			return f.resource(t, f.db(t, func(c *mysql.Config) {
				if c.Params == nil {
					c.Params = map[string]string{}
				}
				c.Params["time_zone"] = "'" + tz + "'"
			}))
		},
		killable: func(t testing.TB) (resource, func()) {
			db := f.db(t, nil)
			db.SetMaxOpenConns(1)
			db.SetMaxIdleConns(1)
			r := f.resource(t, db)
			var id int64
			if err := db.QueryRow("SELECT CONNECTION_ID()").Scan(&id); err != nil {
				t.Fatalf("CONNECTION_ID: %v", err)
			}
			return r, func() {
				if _, err := f.admin.Exec(fmt.Sprintf("KILL CONNECTION %d", id)); err != nil {
					t.Fatalf("KILL CONNECTION %d: %v", id, err)
				}
			}
		},
		closed: func(t testing.TB) resource {
			db := f.db(t, nil)
			r := f.resource(t, db)
			db.Close()
			return r
		},
		refused: func(t testing.TB) resource {
			var refuse refusingDialer
			db := f.db(t, func(c *mysql.Config) {
				c.DialFunc = func(ctx context.Context, network, addr string) (net.Conn, error) {
					return refuse.dial(t, ctx, network, addr)
				}
			})
			r := f.resource(t, db)
			refuse.on.Store(true)
			db.SetMaxIdleConns(0) // closes the idle connections: the next statement dials
			db.SetMaxIdleConns(2)
			return r
		},
		stall: func(t testing.TB, key string) (func() (bool, error), func()) {
			// Every acquire of key first bumps key's counter row: make
			// it (as the first acquire in its bucket would) and lock it.
			ctx := context.Background()
			if _, err := f.admin.ExecContext(ctx, `INSERT INTO distlock_locks (lock_key, owner, token, expires_at)
VALUES (?, '', TIMESTAMPDIFF(MICROSECOND, '1970-01-01', UTC_TIMESTAMP(6)), '9999-12-31 23:59:59')
ON DUPLICATE KEY UPDATE token = token`, counterKey(key)); err != nil {
				t.Fatalf("make the counter row: %v", err)
			}
			tx, err := f.admin.BeginTx(ctx, nil)
			if err != nil {
				t.Fatal(err)
			}
			var tok uint64
			if err := tx.QueryRowContext(ctx, "SELECT token FROM distlock_locks WHERE lock_key = ? FOR UPDATE", counterKey(key)).Scan(&tok); err != nil {
				tx.Rollback()
				t.Fatalf("lock the counter row: %v", err)
			}
			// An acquire statement on the server can only be waiting.
			// (Not INNODB_TRX: polled often, it is never refreshed.)
			waiting := func() (bool, error) {
				var n int
				err := f.admin.QueryRowContext(ctx, "SELECT COUNT(*) FROM information_schema.PROCESSLIST WHERE INFO LIKE 'INSERT INTO `distlock_locks`%' OR INFO LIKE 'SET STATEMENT %INSERT INTO `distlock_locks`%'").Scan(&n)
				return n > 0, err
			}
			return waiting, func() {
				if err := tx.Commit(); err != nil {
					t.Errorf("unlock the counter row: %v", err)
				}
			}
		},
		newResourceWith: func(t testing.TB, opts ...Option) resource {
			return f.resource(t, f.db(t, nil), opts...)
		},
		lockTable: func(t testing.TB, table string) func() {
			ctx := context.Background()
			c, err := f.admin.Conn(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := c.ExecContext(ctx, "LOCK TABLES `"+table+"` WRITE"); err != nil {
				c.Close()
				t.Fatalf("LOCK TABLES %s WRITE: %v", table, err)
			}
			return once(t, func() {
				defer c.Close()
				if _, err := c.ExecContext(ctx, "UNLOCK TABLES"); err != nil {
					t.Errorf("UNLOCK TABLES: %v", err)
				}
			})
		},
		acquiresWaiting: func(ctx context.Context, table string) (int, error) {
			var n int
			err := f.admin.QueryRowContext(ctx, "SELECT COUNT(*) FROM information_schema.PROCESSLIST WHERE ID <> CONNECTION_ID() AND (INFO LIKE CONCAT('INSERT INTO `', ?, '`%') OR INFO LIKE CONCAT('SET STATEMENT %INSERT INTO `', ?, '`%'))", table, table).Scan(&n)
			return n, err
		},
		audit: func(t testing.TB, table string, keys ...string) func(ctx context.Context) (int, error) {
			counters := func(ctx context.Context) (map[string]uint64, error) {
				m := map[string]uint64{}
				for _, k := range keys {
					var tok uint64
					err := f.admin.QueryRowContext(ctx, "SELECT token FROM `"+table+"` WHERE lock_key = ?", counterKey(k)).Scan(&tok)
					if err != nil && !errors.Is(err, sql.ErrNoRows) {
						return nil, err
					}
					m[counterKey(k)] = tok
				}
				return m, nil
			}
			before, err := counters(context.Background())
			if err != nil {
				t.Fatalf("audit %s: %v", table, err)
			}
			return func(ctx context.Context) (int, error) {
				after, err := counters(ctx)
				n := 0
				for c, tok := range after {
					switch {
					case before[c] == 0 && tok != 0:
						n++ // created by an acquire (at the server's time, not a count)
					case tok > before[c]:
						n += int(tok - before[c])
					}
				}
				return n, err
			}
		},
		rowsIn: func(ctx context.Context, table, key string) ([]string, error) {
			rows, err := f.admin.QueryContext(ctx, "SELECT owner FROM `"+table+"` WHERE lock_key = ?", key)
			if err != nil {
				return nil, err
			}
			defer rows.Close()
			return scanOwners(rows.Next, rows.Scan, rows.Err)
		},
	}
}

// kindRows describes a row of the kinds table for Leftovers: a mutex's
// row by its owner, a group's by each of its entries (live or expired),
// or as an empty row.
func kindRows(kind int, owner string, state []byte) ([]string, error) {
	if kind == rowMutex {
		return []string{"row owned by " + owner}, nil
	}
	st, err := parseState(state)
	if err != nil {
		return nil, err
	}
	name := map[int]string{rowSem: "semaphore", rowRW: "read/write lock"}[kind]
	var out []string
	for _, h := range st.H {
		out = append(out, fmt.Sprintf("%s row: %s holder %s", name, h.K, h.O))
	}
	for _, in := range st.I {
		out = append(out, fmt.Sprintf("%s row: %s intent %s", name, in.K, in.O))
	}
	if len(out) == 0 {
		out = append(out, name+" row, empty")
	}
	return out, nil
}

// eventually polls cond every 10ms until it returns true or d passes.
func eventually(t testing.TB, d time.Duration, what string, cond func() (bool, error)) {
	t.Helper()
	deadline := time.Now().Add(d)
	for {
		ok, err := cond()
		if ok {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within %v (last error: %v)", what, d, err)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// requests counts the requests MySQL keeps for key's semaphore: its live
// holders and its queued waiters' live intents (the conformance suite's
// ArrivalOrder case). Mutexes keep no line on MySQL.
func (f *myFixture) requests(ctx context.Context, key string, kind backend.Kind) (int, error) {
	if kind != backend.KindSemaphore {
		return 0, fmt.Errorf("requests of a %v: %w", kind, errors.ErrUnsupported)
	}
	var n int
	err := f.admin.QueryRowContext(ctx, `SELECT COUNT(*) FROM distlock_locks_kinds k,
  JSON_TABLE(JSON_MERGE_PRESERVE(JSON_EXTRACT(k.state, '$.h'), JSON_EXTRACT(k.state, '$.i')), '$[*]' COLUMNS (e BIGINT PATH '$.e')) j
WHERE k.lock_key = ? AND k.kind = 1 AND j.e > TIMESTAMPDIFF(MICROSECOND, '1970-01-01', UTC_TIMESTAMP(6))`, key).Scan(&n)
	return n, err
}
