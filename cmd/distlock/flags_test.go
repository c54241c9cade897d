//go:build unix

package main

import (
	"context"
	"database/sql"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	goredis "github.com/redis/go-redis/v9"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/distlock/distlock"
	"github.com/distlock/distlock/backend"
	"github.com/distlock/distlock/etcd"
	"github.com/distlock/distlock/internal/testserver"
	"github.com/distlock/distlock/redis"
	"github.com/distlock/distlock/sqldb"
)

// The flags users of flock(1), consul lock and etcdctl lock reach for, on
// real servers where the store matters.

// holdInGo takes key through res, as a Go program of the same deployment
// would, and returns what releases it.
func holdInGo(t *testing.T, res backend.RemoteResource, key string) func() {
	t.Helper()
	d, err := distlock.New(res)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { d.Close() })
	lk, err := d.TryLock(context.Background(), key, 0)
	if err != nil {
		t.Fatalf("TryLock(%q) in Go: %v", key, err)
	}
	return func() {
		if err := lk.Unlock(context.Background()); err != nil {
			t.Errorf("Unlock(%q) in Go: %v", key, err)
		}
	}
}

// testShared: a Go program holds key with its own prefix or table; a run
// with the same --prefix or --table (flags) finds it held, a run without
// them does not (it locks another key space), and once the program lets go
// the run with the flags gets it.
func testShared(t *testing.T, url, key string, flags []string, unlock func()) {
	t.Helper()
	args := func(extra ...string) []string {
		return append(append(append([]string{"run", "--store", url, "-n"}, extra...), key), "--", "true")
	}
	if code, stderr := runDistlock(t, nil, args(flags...)...); code != exitNotAcquired {
		t.Errorf("run %q while a Go program holds the key: status %d; want %d; stderr:\n%s", flags, code, exitNotAcquired, stderr)
	}
	if code, stderr := runDistlock(t, nil, args()...); code != 0 {
		t.Errorf("run without %q: status %d; want 0 (another key space); stderr:\n%s", flags, code, stderr)
	}
	unlock()
	if code, stderr := runDistlock(t, nil, args(flags...)...); code != 0 {
		t.Errorf("run %q once the Go program let go: status %d; want 0; stderr:\n%s", flags, code, stderr)
	}
}

// TestPrefixShared: --prefix names the key space a Go program's
// WithPrefix does, on Redis and etcd.
func TestPrefixShared(t *testing.T) {
	t.Run("redis", func(t *testing.T) {
		srv := testserver.Redis(t)
		c := goredis.NewClient(&goredis.Options{Addr: srv.Addr})
		t.Cleanup(func() { c.Close() })
		res, err := redis.New(c, redis.WithPrefix("jobs:"))
		if err != nil {
			t.Fatal(err)
		}
		key := uniqueKey(t)
		testShared(t, "redis://"+srv.Addr, key, []string{"--prefix", "jobs:"}, holdInGo(t, res, key))
		if code, st := statusOf(t, "redis://"+srv.Addr, key, "--prefix", "jobs:"); code != exitFree || st.Held {
			t.Errorf("status --prefix after the runs: %d; want %d (free)", code, exitFree)
		}
	})
	t.Run("etcd", func(t *testing.T) {
		srv := testserver.Etcd(t)
		c, err := clientv3.New(clientv3.Config{Endpoints: srv.Endpoints, DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		res, err := etcd.New(c, etcd.WithPrefix("/jobs/"))
		if err != nil {
			t.Fatal(err)
		}
		key := uniqueKey(t)
		url := "etcd://" + strings.TrimPrefix(srv.Endpoints[0], "http://")
		unlock := holdInGo(t, res, key)
		if code, st := statusOf(t, url, key, "--prefix", "/jobs/"); code != 0 || !st.Held {
			t.Errorf("status --prefix of the key a Go program holds: %d; want 0 (held)", code)
		}
		testShared(t, url, key, []string{"--prefix", "/jobs/"}, unlock)
	})
}

// TestTableShared: --table names the table a Go program's WithTable
// does, on PostgreSQL and MariaDB.
func TestTableShared(t *testing.T) {
	ctx := context.Background()
	t.Run("postgres", func(t *testing.T) {
		srv := testserver.Postgres(t)
		pool, err := pgxpool.New(ctx, srv.DSN)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(pool.Close)
		res, err := sqldb.NewPostgres(ctx, pool, sqldb.WithTable("job_locks"))
		if err != nil {
			t.Fatal(err)
		}
		key := uniqueKey(t)
		testShared(t, srv.DSN, key, []string{"--table", "job_locks"}, holdInGo(t, res, key))
	})
	t.Run("mariadb", func(t *testing.T) {
		srv := testserver.MariaDB(t)
		db, err := sql.Open("mysql", srv.DSN)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { db.Close() })
		res, err := sqldb.NewMySQL(ctx, db, sqldb.WithTable("job_locks"))
		if err != nil {
			t.Fatal(err)
		}
		key := uniqueKey(t)
		testShared(t, "mysql://"+srv.DSN, key, []string{"--table", "job_locks"}, holdInGo(t, res, key))
	})
}

// TestLabel: --label is what status shows as the holder, on every store
// that keeps labels (all of them).
func TestLabel(t *testing.T) {
	for _, k := range storeKinds {
		t.Run(k.name, func(t *testing.T) {
			url := k.url(t)
			key := uniqueKey(t)
			file := filepath.Join(t.TempDir(), "held")
			holder := start(t, nil, append([]string{"run", "--store", url, "--label", "nightly report #7", key}, childCmd("-file", file, "-hold", "stdin")...)...)
			waitRecord(t, file, "start")
			_, st := statusOf(t, url, key)
			if len(st.Holders) != 1 || st.Holders[0].Label != "nightly report #7" {
				t.Errorf("status of a run with --label: holders %+v; want one labelled %q", st.Holders, "nightly report #7")
			}
			holder.stdin.Close()
			if code := holder.wait(); code != 0 {
				t.Errorf("holder: status %d; want 0; stderr:\n%s", code, holder.errText())
			}
		})
	}
}

// TestFlockFlags: -n, -w, -E, -s and -x do what flock's do, on Redis:
// one attempt, a wait in seconds, the conflict status, shared and
// exclusive sides of one read/write lock.
func TestFlockFlags(t *testing.T) {
	url := "redis://" + testserver.Redis(t).Addr
	key := uniqueKey(t)
	file := filepath.Join(t.TempDir(), "held")
	holder := start(t, nil, append([]string{"run", "--store", url, key}, childCmd("-file", file, "-hold", "stdin")...)...)
	waitRecord(t, file, "start")
	if code, stderr := runDistlock(t, nil, "run", "--store", url, "-n", "-E", "9", key, "--", "true"); code != 9 {
		t.Errorf("-n -E 9 while held: status %d; want 9; stderr:\n%s", code, stderr)
	}
	began := time.Now()
	if code, stderr := runDistlock(t, nil, "run", "--store", url, "-w", "0.3", key, "--", "true"); code != exitNotAcquired {
		t.Errorf("-w 0.3 while held: status %d; want %d; stderr:\n%s", code, exitNotAcquired, stderr)
	}
	if el := time.Since(began); el < 300*time.Millisecond {
		t.Errorf("-w 0.3 returned after %v; want it to wait 300ms", el)
	}
	holder.stdin.Close()
	if code := holder.wait(); code != 0 {
		t.Errorf("holder: status %d; want 0; stderr:\n%s", code, holder.errText())
	}

	// -s runs hold the read side together; -x waits for them, and keeps
	// later -s runs out while it waits; a plain run is another lock.
	rw := uniqueKey(t)
	reader := start(t, nil, append([]string{"run", "--store", url, "-s", rw}, childCmd("-file", file, "-hold", "stdin")...)...)
	waitRecords(t, file, "start", 2)
	if code, stderr := runDistlock(t, nil, "run", "--store", url, "-s", "-n", rw, "--", "true"); code != 0 {
		t.Errorf("-s -n while another -s run holds: status %d; want 0; stderr:\n%s", code, stderr)
	}
	if code, stderr := runDistlock(t, nil, "run", "--store", url, "-x", "-n", rw, "--", "true"); code != exitNotAcquired {
		t.Errorf("-x -n while an -s run holds: status %d; want %d; stderr:\n%s", code, exitNotAcquired, stderr)
	}
	if code, stderr := runDistlock(t, nil, "run", "--store", url, "-n", rw, "--", "true"); code != 0 {
		t.Errorf("a plain run while an -s run holds: status %d; want 0 (the mutex is another lock); stderr:\n%s", code, stderr)
	}
	reader.stdin.Close()
	if code := reader.wait(); code != 0 {
		t.Errorf("-s holder: status %d; want 0; stderr:\n%s", code, reader.errText())
	}
}

// TestShellFlag: -c and --shell run a command string through $SHELL,
// with the lock's environment, and distlock exits with its status.
func TestShellFlag(t *testing.T) {
	url := "redis://" + testserver.Redis(t).Addr
	out := filepath.Join(t.TempDir(), "out")
	for _, flag := range []string{"-c", "--shell"} {
		key := uniqueKey(t)
		code, stderr := runDistlock(t, []string{"SHELL=/bin/sh", "OUT=" + out}, "run", "--store", url, flag,
			`echo "$DISTLOCK_KEY $DISTLOCK_TOKEN" > "$OUT"; exit 3`, key)
		if code != 3 {
			t.Errorf("%s: status %d; want 3, the shell's; stderr:\n%s", flag, code, stderr)
		}
		b, err := os.ReadFile(out)
		if err != nil {
			t.Fatal(err)
		}
		f := strings.Fields(string(b))
		if len(f) != 2 || f[0] != key {
			t.Errorf("%s: the command string wrote %q; want the key and a token", flag, b)
		} else if tok, err := strconv.ParseUint(f[1], 10, 64); err != nil || tok == 0 {
			t.Errorf("%s: DISTLOCK_TOKEN %q; want a token", flag, f[1])
		}
	}
}

// TestHoldUntilSignal: without a COMMAND, distlock holds KEY until a
// signal: it prints the key and token on stdout once it holds it, keeps
// others out meanwhile, and on SIGTERM (SIGINT too) releases it and
// exits 0. On Redis and ZooKeeper (whose session keeps the lock).
func TestHoldUntilSignal(t *testing.T) {
	for _, k := range []storeKind{storeKinds[0], storeKinds[3]} {
		t.Run(k.name, func(t *testing.T) {
			url := k.url(t)
			for _, sig := range []syscall.Signal{syscall.SIGTERM, syscall.SIGINT} {
				key := uniqueKey(t)
				p := start(t, nil, "run", "--store", url, key)
				deadline := time.Now().Add(patience)
				var out string
				for !strings.Contains(out, "DISTLOCK_TOKEN=") {
					if time.Now().After(deadline) {
						t.Fatalf("no DISTLOCK_TOKEN on stdout within %v; stderr:\n%s", patience, p.errText())
					}
					time.Sleep(10 * time.Millisecond) // polling what distlock prints, with a deadline
					p.mu.Lock()
					out = p.stdout.String()
					p.mu.Unlock()
				}
				if !strings.HasPrefix(out, "DISTLOCK_KEY="+key+"\nDISTLOCK_TOKEN=") {
					t.Errorf("stdout %q; want DISTLOCK_KEY=%s and DISTLOCK_TOKEN=", out, key)
				}
				if code, stderr := runDistlock(t, nil, "run", "--store", url, "-n", key, "--", "true"); code != exitNotAcquired {
					t.Errorf("-n while held without a command: status %d; want %d; stderr:\n%s", code, exitNotAcquired, stderr)
				}
				if err := p.cmd.Process.Signal(sig); err != nil {
					t.Fatal(err)
				}
				if code := p.wait(); code != 0 {
					t.Errorf("after %v: status %d; want 0; stderr:\n%s", sig, code, p.errText())
				}
				if code, stderr := runDistlock(t, nil, "run", "--store", url, "-n", key, "--", "true"); code != 0 {
					t.Errorf("-n once released: status %d; want 0; stderr:\n%s", code, stderr)
				}
			}
		})
	}
}

// TestVerboseZooKeeperSession: on ZooKeeper, -v says what keeps the lock:
// the session timeout the server granted, not the TTL asked for, which
// the server keeps within its bounds (at most 20 ticks by default: 40s;
// the test server allows 60s).
func TestVerboseZooKeeperSession(t *testing.T) {
	url := "zk://" + testserver.ZooKeeper(t).Addr
	code, stderr := runDistlock(t, nil, "run", "--store", url, "-v", "--ttl", "100s", uniqueKey(t), "--", "true")
	if code != 0 {
		t.Fatalf("status %d; want 0; stderr:\n%s", code, stderr)
	}
	if !strings.Contains(stderr, "(asked: 1m40s") || strings.Contains(stderr, "TTL 1m40s") ||
		strings.Contains(stderr, "times out 1m40s") {
		t.Errorf("-v on ZooKeeper with --ttl 100s:\n%s\nwant the session timeout the server granted, not 1m40s", stderr)
	}
}

// TestVersion: --version prints the version and exits 0.
func TestVersion(t *testing.T) {
	for _, arg := range []string{"--version", "version"} {
		p := start(t, nil, arg)
		code := p.wait()
		p.mu.Lock()
		out := p.stdout.String()
		p.mu.Unlock()
		if code != 0 || !strings.HasPrefix(out, "distlock ") || !strings.Contains(out, " go1.") {
			t.Errorf("distlock %s: status %d, output %q; want 0 and the version", arg, code, out)
		}
	}
}

// freezable are stores a test can freeze (SIGSTOP) and thaw: start starts
// one and returns its URL, and what freezes and thaws it.
var freezable = []struct {
	name  string
	start func(t *testing.T) (url string, pause, resume func())
}{
	{"redis", func(t *testing.T) (string, func(), func()) {
		srv := testserver.Redis(t)
		return "redis://" + srv.Addr, srv.Pause, srv.Resume
	}},
	{"etcd", func(t *testing.T) (string, func(), func()) {
		srv := testserver.Etcd(t)
		return "etcd://" + strings.TrimPrefix(srv.Endpoints[0], "http://"), srv.Pause, srv.Resume
	}},
	{"zookeeper", func(t *testing.T) (string, func(), func()) {
		srv := testserver.ZooKeeper(t)
		return "zk://" + srv.Addr, srv.Pause, srv.Resume
	}},
}

// TestReleaseFailureSaidOnce: when the release after the command fails
// (the store froze as the command ran), distlock says so once, even with
// -v, though it tries the release again (etcd keeps a renewed lock alive
// on a lease: the facade retries it until Close's bound) and fails again.
func TestReleaseFailureSaidOnce(t *testing.T) {
	// Redis: a lock with a TTL; etcd: one its lease keeps alive, which
	// the facade releases again in the background.
	for _, f := range freezable[:2] {
		t.Run(f.name, func(t *testing.T) {
			url, pause, resume := f.start(t)
			key := uniqueKey(t)
			file := filepath.Join(t.TempDir(), "held")
			p := start(t, nil, append([]string{"run", "--store", url, "-v", "--ttl", "1m", key},
				childCmd("-file", file, "-hold", "stdin")...)...)
			waitRecord(t, file, "start")
			pause()
			t.Cleanup(resume)
			p.stdin.Close()
			if code := p.wait(); code != 0 {
				t.Errorf("status %d; want 0, the command's; stderr:\n%s", code, p.errText())
			}
			if n := strings.Count(p.errText(), "release "+strconv.Quote(key)); n != 1 {
				t.Errorf("the failed release said %d times; want once:\n%s", n, p.errText())
			}
			if strings.Contains(p.errText(), "distlock: distlock:") {
				t.Errorf("a doubled prefix:\n%s", p.errText())
			}
		})
	}
}

// TestOneAttemptFrozenStore: -n on a store that accepts connections but
// does not answer (frozen, SIGSTOP) exits 69 within about two seconds
// (a second to connect, a second for the attempt), whatever the clients'
// own timeouts (the Redis PING's read timeout is 3s) and the TTL; before,
// a run took 5s and more.
func TestOneAttemptFrozenStore(t *testing.T) {
	for _, f := range freezable {
		t.Run(f.name, func(t *testing.T) {
			url, pause, resume := f.start(t)
			pause()
			t.Cleanup(resume)
			began := time.Now()
			code, stderr := runDistlock(t, nil, "run", "--store", url, "-n", "--ttl", "1m", uniqueKey(t), "--", "true")
			el := time.Since(began)
			if code != exitUnavailable {
				t.Errorf("-n on a frozen store: status %d; want %d; stderr:\n%s", code, exitUnavailable, stderr)
			}
			// Two bounds of a second each, and two seconds of slack for
			// a loaded machine (the process's start, a race-built
			// binary): far below the 5s to 7s it took before.
			if el > 4*time.Second {
				t.Errorf("-n on a frozen store took %v; want about 2s at most; stderr:\n%s", el, stderr)
			}
		})
	}
}
