package sqldb

import (
	"context"
	"fmt"
	"os"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/distlock/distlock/backend"
	"github.com/distlock/distlock/testsuite"
)

// spelling is one way to name a lock table: the WithTable argument and the
// pool settings under which it resolves to the table meant.
type spelling struct {
	name  string
	table string
	tweak func(*pgxpool.Config)
}

func (s spelling) resource(t testing.TB, pg *pgFixture) *Postgres {
	return pg.resource(t, pg.pool(t, s.tweak), WithTable(s.table))
}

// spellingPair is two spellings of one table, and that table schema-
// qualified for the test's own statements.
type spellingPair struct {
	a, b      spelling
	qualified string
}

// tableSpellings returns pairs of spellings that name one table each: "t"
// and "public.t", and "t" under a search_path that finds it in another
// schema and "schema.t". The tables are new to the test.
func tableSpellings(t *testing.T, pg *pgFixture) []spellingPair {
	tbl := fmt.Sprintf("spell_%d", time.Now().UnixNano()%1e9)
	schema := "s_" + tbl
	if _, err := pg.admin.Exec(t.Context(), `CREATE SCHEMA `+schema); err != nil {
		t.Fatal(err)
	}
	inSchema := func(c *pgxpool.Config) { c.ConnConfig.RuntimeParams["search_path"] = schema }
	return []spellingPair{
		{
			a:         spelling{"t", tbl, nil},
			b:         spelling{"public.t", "public." + tbl, nil},
			qualified: "public." + tbl,
		},
		{
			a:         spelling{"t under search_path", tbl, inSchema},
			b:         spelling{"schema.t", schema + "." + tbl, nil},
			qualified: schema + "." + tbl,
		},
	}
}

// stallClass is the advisory lock class the test's trigger waits on.
const stallClass = 42

// stallInserts installs a trigger on table that makes every insert wait,
// after the row's values (its token among them) are computed and before
// the row goes in, on the advisory lock (stallClass, hashtext(owner)).
// stall(owner) takes that lock in an admin session and returns a func that
// releases it; stalled(owner) reports whether an insert waits on it now.
func stallInserts(t *testing.T, pg *pgFixture, table string) (stall func(owner string) (release func()), stalled func(owner string) (bool, error)) {
	fn := table + "_stall"
	if _, err := pg.admin.Exec(t.Context(), `CREATE FUNCTION `+fn+`() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  PERFORM pg_advisory_xact_lock(`+fmt.Sprint(stallClass)+`, hashtext(NEW.owner));
  RETURN NEW;
END $$;
CREATE TRIGGER stall BEFORE INSERT ON `+table+` FOR EACH ROW EXECUTE FUNCTION `+fn+`()`); err != nil {
		t.Fatalf("create the stalling trigger: %v", err)
	}
	stall = func(owner string) func() {
		ctx := context.Background()
		c, err := pg.admin.Acquire(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := c.Exec(ctx, `SELECT pg_advisory_lock($1::int4, hashtext($2::text))`, stallClass, owner); err != nil {
			c.Release()
			t.Fatalf("pg_advisory_lock: %v", err)
		}
		done := false
		return func() {
			if done {
				return
			}
			done = true
			defer c.Release()
			if _, err := c.Exec(ctx, `SELECT pg_advisory_unlock($1::int4, hashtext($2::text))`, stallClass, owner); err != nil {
				t.Errorf("pg_advisory_unlock: %v", err)
			}
		}
	}
	stalled = func(owner string) (bool, error) {
		var n int
		err := pg.admin.QueryRow(context.Background(), `SELECT count(*) FROM pg_locks
WHERE locktype = 'advisory' AND NOT granted AND classid = $1::int4::oid AND objid = hashtext($2::text)::oid`,
			stallClass, owner).Scan(&n)
		return n > 0, err
	}
	return stall, stalled
}

// testSpellingsTokenOrder: two resources that name
// one table differently ("t" and "public.t") must order their token draws
// on one lock. The trigger stalls a's acquire after it has drawn its token
// and before its row goes in. b then acquires the same key: it must queue
// behind a (its draw would come after a's commit), not draw a larger token,
// take the key, and leave a to take it next with the smaller token.
func testSpellingsTokenOrder(t *testing.T, pg *pgFixture) {
	for _, sp := range tableSpellings(t, pg) {
		t.Run(sp.a.name+" vs "+sp.b.name, func(t *testing.T) {
			a := sp.a.resource(t, pg)
			b := sp.b.resource(t, pg)
			stall, stalled := stallInserts(t, pg, sp.qualified)
			key := testsuite.Key(t)
			la, lb := newLease(t, key, time.Minute), newLease(t, key, time.Minute)

			// Grants in the order TryAcquire returned them; each holder
			// releases before the next is granted.
			var last *backend.Lease
			granted := func(who string, l *backend.Lease) {
				t.Helper()
				if last != nil && l.Token <= last.Token {
					t.Errorf("%s granted token %d after a holder with token %d: tokens went backwards", who, l.Token, last.Token)
				}
				last = l
			}
			type result struct {
				ok  bool
				err error
			}
			acquire := func(r *Postgres, l *backend.Lease) <-chan result {
				ch := make(chan result, 1)
				go func() {
					ok, _, err := r.TryAcquire(context.Background(), l)
					ch <- result{ok, err}
				}()
				return ch
			}

			release := stall(la.Value)
			defer release()
			resA := acquire(a, la)
			eventually(t, 10*time.Second, "a's insert stalled after drawing its token", func() (bool, error) {
				return stalled(la.Value)
			})

			// b either queues behind a on the key's ordering lock (right)
			// or runs to the end (wrong: it drew after a and commits first).
			resB := acquire(b, lb)
			var (
				rb    result
				bDone bool
			)
			eventually(t, 10*time.Second, "b finished or waits behind a", func() (bool, error) {
				select {
				case rb = <-resB:
					bDone = true
					return true, nil
				default:
				}
				var n int
				err := pg.admin.QueryRow(context.Background(), `SELECT count(*) FROM pg_locks
WHERE locktype = 'advisory' AND NOT granted AND classid <> $1::int4::oid AND objid = hashtext($2::text)::oid`,
					stallClass, key).Scan(&n)
				return n > 0, err
			})
			if bDone {
				if rb.err != nil {
					t.Fatalf("b's TryAcquire: %v", rb.err)
				}
				if rb.ok {
					granted("b", lb)
					if err := b.Release(t.Context(), lb); err != nil {
						t.Fatal(err)
					}
				}
			}

			release()
			ra := <-resA
			if !ra.ok || ra.err != nil {
				t.Fatalf("a's TryAcquire = %v, %v; want acquired", ra.ok, ra.err)
			}
			granted("a", la)
			if !bDone {
				if rb = <-resB; rb.ok || rb.err != nil {
					t.Fatalf("b's TryAcquire while a holds = %v, %v; want false, nil", rb.ok, rb.err)
				}
			}
			if err := a.Release(t.Context(), la); err != nil {
				t.Fatal(err)
			}
			if !bDone || !rb.ok {
				mustAcquire(t, b, lb)
				granted("b", lb)
				if err := b.Release(t.Context(), lb); err != nil {
					t.Fatal(err)
				}
			}
		})
	}
}

// testSpellingsNotify checks that a release through one spelling of the
// table wakes a waiter subscribed through another: both name one channel.
func testSpellingsNotify(t *testing.T, pg *pgFixture) {
	for _, sp := range tableSpellings(t, pg) {
		t.Run(sp.a.name+" vs "+sp.b.name, func(t *testing.T) {
			for _, dir := range [][2]spelling{{sp.a, sp.b}, {sp.b, sp.a}} {
				holder, waiter := dir[0].resource(t, pg), dir[1].resource(t, pg)
				key := testsuite.Key(t)
				l := newLease(t, key, time.Minute)
				mustAcquire(t, holder, l)
				// The waiter's attempt marks the row waited: the release
				// will notify.
				if ok, _, err := waiter.TryAcquire(t.Context(), newLease(t, key, time.Minute)); ok || err != nil {
					t.Fatalf("contended TryAcquire = %v, %v; want false, nil", ok, err)
				}
				ch, cancel := waiter.Subscribe(key)
				defer cancel()
				select { // the wake-up everyone gets once the LISTEN is in place
				case <-ch:
				case <-time.After(10 * time.Second):
					t.Fatalf("no wake after the LISTEN connection came up")
				}
				if err := holder.Release(t.Context(), l); err != nil {
					t.Fatal(err)
				}
				select {
				case <-ch:
				case <-time.After(10 * time.Second):
					t.Fatalf("release through %q did not wake the waiter subscribed through %q", dir[0].table, dir[1].table)
				}
			}
		})
	}
}

// testSpellingsConcurrency runs the concurrency workload with instances
// that name the table two ways: one holder at a time, tokens increasing.
func testSpellingsConcurrency(t *testing.T, pg *pgFixture) {
	for _, sp := range tableSpellings(t, pg) {
		t.Run(sp.a.name+" vs "+sp.b.name, func(t *testing.T) {
			sp.a.resource(t, pg) // create the table before the instances race to
			n := 0
			testConcurrency(t, func(t testing.TB) resource {
				n++
				if n%2 == 0 {
					return sp.b.resource(t, pg)
				}
				return sp.a.resource(t, pg)
			})
		})
	}
}

// requirePassword makes the server ask role for its password (SCRAM) on
// TCP from 127.0.0.1, by a line put in front of pg_hba.conf, until t ends.
// The test servers trust every connection; a password is checked only
// where pg_hba.conf says so. It needs the server's hba file to be
// writable here (a server internal/testserver started is).
func requirePassword(t *testing.T, pg *pgFixture, role string) {
	var hba string
	if err := pg.admin.QueryRow(t.Context(), `SHOW hba_file`).Scan(&hba); err != nil {
		t.Fatal(err)
	}
	orig, err := os.ReadFile(hba)
	if err == nil {
		err = os.WriteFile(hba, append([]byte("host all "+role+" 127.0.0.1/32 scram-sha-256\n"), orig...), 0o600)
	}
	if err != nil {
		msg := fmt.Sprintf("cannot require a password: the server's %s is not writable here: %v", hba, err)
		if os.Getenv("CI") != "" {
			t.Fatal(msg)
		}
		t.Skip(msg)
	}
	reload := func() {
		if _, err := pg.admin.Exec(context.Background(), `SELECT pg_reload_conf()`); err != nil {
			t.Errorf("pg_reload_conf: %v", err)
		}
	}
	t.Cleanup(func() {
		if err := os.WriteFile(hba, orig, 0o600); err != nil {
			t.Errorf("restore %s: %v", hba, err)
		}
		reload()
	})
	reload()
	// The postmaster rereads the file when it gets to the signal.
	cfg, err := pgx.ParseConfig(pg.dsn)
	if err != nil {
		t.Fatal(err)
	}
	cfg.User, cfg.Password = role, ""
	eventually(t, 10*time.Second, "the server asks "+role+" for a password", func() (bool, error) {
		c, err := pgx.ConnectConfig(t.Context(), cfg)
		if err == nil {
			c.Close(context.Background())
			return false, nil
		}
		return true, nil
	})
}

// testListenDynamicCredentials builds a resource over a pool whose config
// holds no password: its BeforeConnect hook supplies it, as pools with
// short-lived credentials (IAM tokens, Vault) do. The LISTEN connection
// must be made the way the pool makes its connections, or it never
// connects and waiters are never woken.
func testListenDynamicCredentials(t *testing.T, pg *pgFixture) {
	role := fmt.Sprintf("dyn_%d", time.Now().UnixNano()%1e9)
	const password = "s3cret"
	pg.resource(t, pg.admin) // the table exists
	for _, q := range []string{
		`CREATE ROLE ` + role + ` LOGIN PASSWORD '` + password + `'`,
		`GRANT SELECT, INSERT, UPDATE, DELETE ON ` + DefaultTable + ` TO ` + role,
		`GRANT USAGE ON SEQUENCE ` + DefaultTable + `_token_seq TO ` + role,
	} {
		if _, err := pg.admin.Exec(t.Context(), q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	t.Cleanup(func() {
		ctx := context.Background()
		pg.admin.Exec(ctx, `REVOKE ALL ON `+DefaultTable+` FROM `+role)
		pg.admin.Exec(ctx, `REVOKE ALL ON SEQUENCE `+DefaultTable+`_token_seq FROM `+role)
	})
	requirePassword(t, pg, role)

	var hooked atomic.Int32
	pool := pg.pool(t, func(c *pgxpool.Config) {
		c.ConnConfig.User, c.ConnConfig.Password = role, ""
		c.BeforeConnect = func(_ context.Context, cc *pgx.ConnConfig) error {
			hooked.Add(1)
			cc.Password = password
			return nil
		}
	})
	waiter := pg.resource(t, pool)
	holder := pg.resource(t, pg.pool(t, nil))
	key := testsuite.Key(t)
	l := newLease(t, key, time.Minute)
	mustAcquire(t, holder, l)
	// Through the hooked pool: the pool itself connects.
	if ok, _, err := waiter.TryAcquire(t.Context(), newLease(t, key, time.Minute)); ok || err != nil {
		t.Fatalf("contended TryAcquire over the hooked pool = %v, %v; want false, nil", ok, err)
	}
	ch, cancel := waiter.Subscribe(key)
	defer cancel()
	select { // only a LISTEN that succeeded wakes everyone once
	case <-ch:
	case <-time.After(10 * time.Second):
		t.Fatalf("the LISTEN connection did not come up (BeforeConnect ran %d times)", hooked.Load())
	}
	if err := holder.Release(t.Context(), l); err != nil {
		t.Fatal(err)
	}
	select {
	case <-ch:
	case <-time.After(10 * time.Second):
		t.Fatalf("no release notice over the hooked pool's LISTEN connection")
	}
}
