//go:build unix

package main

import (
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	_ "github.com/jackc/pgx/v5/stdlib" // testserver.Postgres talks to the server through database/sql

	"github.com/distlock/distlock/internal/testserver"
)

// storeKind starts a real server of one kind for a test and returns its
// distlock URL.
type storeKind struct {
	name   string
	tokens bool // the store makes fencing tokens (Redlock: 0)
	// freed is how long after its holder died a key is free at the
	// latest, for a TTL of ttl.
	freed func(ttl time.Duration) time.Duration
	url   func(t *testing.T) string
	// noKinds says why the store holds no semaphores or read/write locks
	// ("" when it holds them): distlock refuses --limit, --shared and
	// --exclusive on it with exit status 2.
	noKinds string
	// noInspect says why the store cannot tell who holds a lock ("" when
	// it can): distlock status exits 2 on it.
	noInspect string
}

func ttlFreed(ttl time.Duration) time.Duration { return ttl }

var storeKinds = []storeKind{
	{"redis", true, ttlFreed, func(t *testing.T) string { return "redis://" + testserver.Redis(t).Addr }, "", ""},
	{"redlock", false, ttlFreed, func(t *testing.T) string {
		var urls []string
		for _, s := range testserver.RedisNodes(t, 3) {
			urls = append(urls, "redis://"+s.Addr)
		}
		return "redlock:" + strings.Join(urls, ",")
	}, "majorities cannot bound them", ""},
	// A renewed etcd lock lives on a lease shared by the locks of its TTL,
	// which lives their TTL (etcd's package doc).
	{"etcd", true, ttlFreed, func(t *testing.T) string {
		var hosts []string
		for _, ep := range testserver.Etcd(t).Endpoints {
			hosts = append(hosts, strings.TrimPrefix(ep, "http://"))
		}
		return "etcd://" + strings.Join(hosts, ",")
	}, "", ""},
	// ZooKeeper frees the key when the session, asked for with the TTL,
	// expires.
	{"zookeeper", true, ttlFreed, func(t *testing.T) string { return "zk://" + testserver.ZooKeeper(t).Addr }, "", ""},
	{"postgres", true, ttlFreed, func(t *testing.T) string { return testserver.Postgres(t).DSN }, "", ""},
	{"mariadb", true, ttlFreed, func(t *testing.T) string { return "mysql://" + testserver.MariaDB(t).DSN }, "", ""},
}

// TestStores runs the mutex behaviours on every store, against a real
// server each.
func TestStores(t *testing.T) {
	for _, k := range storeKinds {
		t.Run(k.name, func(t *testing.T) {
			url := k.url(t)
			t.Run("RunsNeverOverlap", func(t *testing.T) { testNoOverlap(t, k, url) })
			t.Run("WaitZeroWhileHeld", func(t *testing.T) { testConflict(t, url) })
			t.Run("KillFreesKey", func(t *testing.T) { testKill(t, k, url) })
			t.Run("Status", func(t *testing.T) { testStatus(t, k, url) })
		})
	}
}

// testNoOverlap: two loops run distlock three times each on one key at
// once; the children's records show one holder at a time, each seeing
// the key and a token larger than the one before (0 everywhere on
// Redlock).
func testNoOverlap(t *testing.T, k storeKind, url string) {
	key := uniqueKey(t)
	file := filepath.Join(t.TempDir(), "runs")
	var wg sync.WaitGroup
	for range 2 {
		wg.Go(func() {
			for range 3 {
				code, stderr := runDistlock(t, nil, append([]string{"run", "--store", url, "--wait", "60s", key},
					childCmd("-file", file, "-hold", "50ms")...)...)
				if code != 0 {
					t.Errorf("distlock: status %d; want 0; stderr:\n%s", code, stderr)
				}
			}
		})
	}
	wg.Wait()
	rs := readRecords(t, file)
	if len(rs) != 12 {
		t.Fatalf("%d records; want 12 (6 runs): %+v", len(rs), rs)
	}
	for i := 0; i < len(rs); i += 2 {
		s, e := rs[i], rs[i+1]
		if s.event != "start" || e.event != "end" || s.pid != e.pid {
			t.Fatalf("records %d and %d: %+v, %+v; want the start and end of one run: runs overlapped", i, i+1, s, e)
		}
		if s.key != key {
			t.Errorf("run %d saw DISTLOCK_KEY %q; want %q", i/2, s.key, key)
		}
		if i > 0 {
			prev := rs[i-1]
			if s.at < prev.at {
				t.Errorf("run %d started at %d, before run %d ended at %d", i/2, s.at, i/2-1, prev.at)
			}
			if k.tokens && s.token <= rs[i-2].token {
				t.Errorf("run %d has token %d after run %d's %d; want it larger", i/2, s.token, i/2-1, rs[i-2].token)
			}
		}
		if !k.tokens && s.token != 0 {
			t.Errorf("run %d has token %d on a store without tokens; want 0", i/2, s.token)
		}
	}
}

// testConflict: while a run holds the key, --wait 0 exits at once with
// the conflict status (75, or --conflict-exit-code), quietly without -v,
// and its command does not run; after the holder ends, it runs.
func testConflict(t *testing.T, url string) {
	key := uniqueKey(t)
	dir := t.TempDir()
	held, other := filepath.Join(dir, "held"), filepath.Join(dir, "other")
	holder := start(t, nil, append([]string{"run", "--store", url, key}, childCmd("-file", held, "-hold", "stdin")...)...)
	waitRecord(t, held, "start")
	for _, c := range []struct {
		flags  []string
		code   int
		stderr string
	}{
		{[]string{"--wait", "0"}, exitNotAcquired, ""},
		{[]string{"--wait", "0", "--conflict-exit-code", "9"}, 9, ""},
		{[]string{"--wait", "0", "--conflict-exit-code", "0", "-v"}, 0, "is held by another owner"},
		// A wait long enough for a new process to reach its store on
		// a loaded machine (100ms once ended with no answer, status 69).
		{[]string{"--wait", "500ms"}, exitNotAcquired, ""},
	} {
		args := append(append([]string{"run", "--store", url}, c.flags...), key)
		code, stderr := runDistlock(t, nil, append(args, childCmd("-file", other)...)...)
		if code != c.code || !strings.Contains(stderr, c.stderr) || (c.stderr == "" && stderr != "") {
			t.Errorf("distlock %q while held: status %d, stderr %q; want %d, %q", c.flags, code, stderr, c.code, c.stderr)
		}
	}
	if rs := readRecords(t, other); len(rs) != 0 {
		t.Errorf("a command ran while the key was held: %+v", rs)
	}
	if code := holder.wait(); code != 0 {
		t.Errorf("holder: status %d; want 0; stderr:\n%s", code, holder.errText())
	}
	code, stderr := runDistlock(t, nil, append([]string{"run", "--store", url, "--wait", "0", key}, childCmd("-file", other)...)...)
	if code != 0 || len(readRecords(t, other)) != 2 {
		t.Errorf("after the holder released: status %d (want 0), records %+v; stderr:\n%s", code, readRecords(t, other), stderr)
	}
}

// testKill: a distlock killed with SIGKILL takes its command with it (the
// parent-death signal) and leaves the key held, until the store frees it
// within its TTL (the store's bound, k.freed).
func testKill(t *testing.T, k storeKind, url string) {
	const ttl = 3 * time.Second
	key := uniqueKey(t)
	file := filepath.Join(t.TempDir(), "held")
	holder := start(t, nil, append([]string{"run", "--store", url, "--ttl", ttl.String(), key}, childCmd("-file", file, "-hold", "stdin")...)...)
	child := waitRecord(t, file, "start")
	if err := holder.cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	killed := time.Now()
	if code := holder.wait(); code != 128+int(syscall.SIGKILL) {
		t.Errorf("killed distlock: status %d; want %d (SIGKILL)", code, 128+int(syscall.SIGKILL))
	}
	waitGone(t, child.pid, "the command of a killed distlock")
	if code, stderr := runDistlock(t, nil, "run", "--store", url, "--wait", "0", key, "--", "true"); code != exitNotAcquired {
		t.Errorf("right after the kill: status %d; want %d (the key still held until its TTL); stderr:\n%s", code, exitNotAcquired, stderr)
	}
	// Liveness, with room for a loaded machine: the bound is what the
	// store promises, and the wait gives it 5s more.
	wait := k.freed(ttl) + 5*time.Second
	code, stderr := runDistlock(t, nil, "run", "--store", url, "--wait", wait.String(), key, "--", "true")
	if code != 0 {
		t.Fatalf("after the kill: status %d; want 0 within --wait %v; stderr:\n%s", code, wait, stderr)
	}
	t.Logf("the key of a killed holder was acquired again %v after the kill (TTL %v, the store's bound %v)",
		time.Since(killed).Round(time.Millisecond), ttl, k.freed(ttl))
}

// TestExitStatus: distlock exits with its command's status, or 128+N
// when signal N ended the command, and releases the key either way.
func TestExitStatus(t *testing.T) {
	url := "redis://" + testserver.Redis(t).Addr
	key := uniqueKey(t)
	for _, c := range []struct{ exit, want int }{{0, 0}, {3, 3}, {-int(syscall.SIGTERM), 143}, {-int(syscall.SIGKILL), 137}} {
		code, stderr := runDistlock(t, nil, append([]string{"run", "--store", url, key}, childCmd("-exit", strconv.Itoa(c.exit))...)...)
		if code != c.want {
			t.Errorf("command exiting with %d: status %d; want %d; stderr:\n%s", c.exit, code, c.want, stderr)
		}
		if code, _ := runDistlock(t, nil, "run", "--store", url, "--wait", "0", key, "--", "true"); code != 0 {
			t.Errorf("after a command that exited with %d: the key is not free (status %d)", c.exit, code)
		}
	}
}

// TestSignals: SIGTERM, SIGINT, SIGHUP and SIGUSR1 sent to distlock reach
// its command once each; a command that dies of one gives 128+N; a signal
// while waiting for the key ends the wait with 128+N, the command never
// started.
func TestSignals(t *testing.T) {
	url := "redis://" + testserver.Redis(t).Addr
	t.Run("Forwarded", func(t *testing.T) {
		key := uniqueKey(t)
		file := filepath.Join(t.TempDir(), "child")
		p := start(t, nil, append([]string{"run", "--store", url, key}, childCmd("-file", file, "-hold", "stdin", "-signals")...)...)
		waitRecord(t, file, "start")
		sent := []syscall.Signal{syscall.SIGTERM, syscall.SIGINT, syscall.SIGHUP, syscall.SIGUSR1}
		for i, s := range sent {
			if err := p.cmd.Process.Signal(s); err != nil {
				t.Fatal(err)
			}
			waitRecords(t, file, "signal", i+1) // one at a time: the child records them in order
		}
		if code := p.wait(); code != 0 {
			t.Errorf("status %d; want the command's, 0; stderr:\n%s", code, p.errText())
		}
		var got []string
		for _, r := range readRecords(t, file) {
			if r.event == "signal" {
				got = append(got, r.name)
			}
		}
		if want := []string{"TERM", "INT", "HUP", "USR1"}; !slices.Equal(got, want) {
			t.Errorf("the command got %q; want each once: %q", got, want)
		}
	})
	t.Run("CommandDies", func(t *testing.T) {
		key := uniqueKey(t)
		file := filepath.Join(t.TempDir(), "child")
		p := start(t, nil, append([]string{"run", "--store", url, key}, childCmd("-file", file, "-hold", "stdin")...)...)
		waitRecord(t, file, "start")
		p.cmd.Process.Signal(syscall.SIGTERM)
		// Exited before wait closes its stdin: the command ends at its
		// stdin's end, with status 0, when that comes before the signal.
		select {
		case <-p.exited:
		case <-time.After(patience):
			t.Fatalf("distlock still running %v after SIGTERM; stderr:\n%s", patience, p.errText())
		}
		if code := p.wait(); code != 128+int(syscall.SIGTERM) {
			t.Errorf("status %d; want %d; stderr:\n%s", code, 128+int(syscall.SIGTERM), p.errText())
		}
		if code, _ := runDistlock(t, nil, "run", "--store", url, "--wait", "0", key, "--", "true"); code != 0 {
			t.Errorf("the key is not free after the command died (status %d)", code)
		}
	})
	t.Run("WhileWaiting", func(t *testing.T) {
		key := uniqueKey(t)
		dir := t.TempDir()
		held, waiting := filepath.Join(dir, "held"), filepath.Join(dir, "waiting")
		holder := start(t, nil, append([]string{"run", "--store", url, key}, childCmd("-file", held, "-hold", "stdin")...)...)
		waitRecord(t, held, "start")
		for _, s := range []syscall.Signal{syscall.SIGINT, syscall.SIGTERM} {
			w := start(t, nil, append([]string{"run", "--store", url, "-v", "--wait", "1h", key}, childCmd("-file", waiting)...)...)
			w.waitLine("waiting for")
			w.cmd.Process.Signal(s)
			if code := w.wait(); code != 128+int(s) {
				t.Errorf("%v while waiting: status %d; want %d; stderr:\n%s", s, code, 128+int(s), w.errText())
			}
		}
		if rs := readRecords(t, waiting); len(rs) != 0 {
			t.Errorf("an interrupted waiter ran its command: %+v", rs)
		}
		if code := holder.wait(); code != 0 {
			t.Errorf("holder: status %d; want 0", code)
		}
	})
}

// waitRecords polls a child's file until it has n records of event.
func waitRecords(t *testing.T, file, event string, n int) {
	t.Helper()
	deadline := time.Now().Add(patience)
	for {
		got := 0
		for _, r := range readRecords(t, file) {
			if r.event == event {
				got++
			}
		}
		if got >= n {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: %d %q records within %v; want %d", file, got, event, patience, n)
		}
		time.Sleep(5 * time.Millisecond) // polling a file the child writes, with a deadline
	}
}

// TestVerbose: -v says waiting, acquired with the token the command got,
// renewed, the command's status and released; without -v a run that
// succeeds says nothing.
func TestVerbose(t *testing.T) {
	url := "redis://" + testserver.Redis(t).Addr
	key := uniqueKey(t)
	file := filepath.Join(t.TempDir(), "child")
	p := start(t, nil, append([]string{"run", "--store", url, "-v", "--ttl", "600ms", key}, childCmd("-file", file, "-hold", "stdin", "-exit", "4")...)...)
	p.waitLine("waiting for " + strconv.Quote(key))
	acquired := p.waitLine("acquired " + strconv.Quote(key))
	child := waitRecord(t, file, "start")
	if want := "with token " + strconv.FormatUint(child.token, 10) + " "; !strings.Contains(acquired, want) {
		t.Errorf("%q; want %q, the token the command got", acquired, want)
	}
	p.waitLine("renewed " + strconv.Quote(key)) // TTL/3 after the acquisition
	if code := p.wait(); code != 4 {
		t.Errorf("status %d; want 4", code)
	}
	for _, want := range []string{"the command exited with status 4", "released " + strconv.Quote(key)} {
		if !strings.Contains(p.errText(), want) {
			t.Errorf("stderr does not say %q:\n%s", want, p.errText())
		}
	}
	if code, stderr := runDistlock(t, nil, "run", "--store", url, key, "--", "true"); code != 0 || stderr != "" {
		t.Errorf("without -v: status %d, stderr %q; want 0 and nothing", code, stderr)
	}
}

// TestStoreUnreachable: a store nobody answers at exits 69, naming it and
// the cause (a refused connection, on a port nobody listens on), before
// the command runs.
func TestStoreUnreachable(t *testing.T) {
	dead := listen(t).Addr().String() // a port of ours...
	ln := listen(t)
	ln.Close() // ...and one nobody listens on
	closed := ln.Addr().String()
	file := filepath.Join(t.TempDir(), "child")
	for _, url := range []string{
		"redis://" + closed,
		"redlock:redis://" + closed + ",redis://" + closed + ",redis://" + closed,
		"etcd://" + closed + "?dial_timeout=500ms",
		"zk://" + closed + "?dial_timeout=500ms",
		"postgres://postgres@" + closed + "/db",
		"mysql://root@" + closed + "/db",
		"redis://" + dead + "?read_timeout=200ms", // closes every connection
	} {
		code, stderr := runDistlock(t, nil, append([]string{"run", "--store", url, "--wait", "0", "k"}, childCmd("-file", file)...)...)
		if code != exitUnavailable || !strings.Contains(stderr, closed) && !strings.Contains(stderr, dead) {
			t.Errorf("%s: status %d, stderr:\n%s\nwant %d and the store's address", url, code, stderr, exitUnavailable)
		}
		if strings.Contains(url, closed) && !strings.Contains(stderr, "connection refused") {
			t.Errorf("%s: stderr:\n%s\nwant the cause, connection refused", url, stderr)
		}
		t.Logf("%s: %s", url, stderr)
	}
	if rs := readRecords(t, file); len(rs) != 0 {
		t.Errorf("a command ran without its store: %+v", rs)
	}
}
