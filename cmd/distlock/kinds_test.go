//go:build unix

package main

import (
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestKinds runs semaphores (--limit) and read/write locks (--shared,
// --exclusive) on every store, against a real server each: on the stores
// that hold them, the limit and the exclusion hold; on the others,
// distlock refuses them with exit status 2 and runs nothing.
func TestKinds(t *testing.T) {
	for _, k := range storeKinds {
		t.Run(k.name, func(t *testing.T) {
			url := k.url(t)
			if k.noKinds != "" {
				t.Run("Refused", func(t *testing.T) { testKindsRefused(t, url) })
				return
			}
			t.Run("SemaphoreLimit", func(t *testing.T) { testSemaphoreLimit(t, k, url) })
			t.Run("ReadWrite", func(t *testing.T) { testReadWrite(t, k, url) })
			t.Run("LimitMismatch", func(t *testing.T) { testLimitMismatch(t, url) })
		})
	}
}

// testSemaphoreLimit: five runs with --limit 2 of one key, each holding
// until the test lets it go: two run at once, never three, and the others
// start as those end. Every run got a token of its own, larger than the
// tokens of the runs that ended before it started.
func testSemaphoreLimit(t *testing.T, k storeKind, url string) {
	const runs, limit = 5, 2
	key := uniqueKey(t)
	file := filepath.Join(t.TempDir(), "runs")
	if code, st := statusOf(t, url, key, "--limit", "2"); code != exitFree || st.Kind != "semaphore" {
		t.Errorf("status before the runs: %d, kind %q; want %d, semaphore", code, st.Kind, exitFree)
	}
	byPid := map[int]*proc{}
	for range runs {
		p := start(t, nil, append([]string{"run", "--store", url, "--limit", "2", "--wait", "2m", key},
			childCmd("-file", file, "-hold", "stdin")...)...)
		byPid[p.cmd.Process.Pid] = p
	}
	for ended := 0; ended < runs; ended++ {
		running := waitRunning(t, file, min(limit, runs-ended), limit)
		if ended == 0 { // status shows the two holders
			code, st := statusOf(t, url, key, "--limit", "2")
			if code != 0 || st.Limit != limit {
				t.Errorf("status while two hold: %d, limit %d; want 0, %d", code, st.Limit, limit)
			}
			checkHolders(t, k, st, "semaphore", running)
			if code, out := statusText(t, url, key, "--limit", "2"); code != 0 || !strings.Contains(out, "(semaphore, limit 2): 2 of 2 permits held") {
				t.Errorf("status while two hold: %d, output:\n%s", code, out)
			}
		}
		p := byPid[running[0].ppid]
		if p == nil {
			t.Fatalf("a run of distlock pid %d, which the test did not start", running[0].ppid)
		}
		if code := p.wait(); code != 0 { // its command ends, then it releases its permit
			t.Fatalf("distlock: status %d; want 0; stderr:\n%s", code, p.errText())
		}
	}
	rs := readRecords(t, file)
	if len(rs) != 2*runs {
		t.Fatalf("%d records; want %d (%d runs): %+v", len(rs), 2*runs, runs, rs)
	}
	// The file has the starts and ends in the order they happened.
	now, most := 0, 0
	tokens := map[uint64]bool{}
	var endedTokens []uint64
	for _, r := range rs {
		switch r.event {
		case "start":
			now++
			most = max(most, now)
			if k.tokens && tokens[r.token] {
				t.Errorf("token %d given to two runs", r.token)
			}
			tokens[r.token] = true
			for _, e := range endedTokens {
				if k.tokens && r.token <= e {
					t.Errorf("a run started with token %d after a run with token %d ended; want it larger", r.token, e)
				}
			}
		case "end":
			now--
			endedTokens = append(endedTokens, r.token)
		}
	}
	if most != limit {
		t.Errorf("at most %d runs at once; want %d (--limit %d)", most, limit, limit)
	}
}

// waitRunning polls a child's file until want commands are running
// (started, not ended) and returns their start records; more than limit
// at any time fails the test.
func waitRunning(t *testing.T, file string, want, limit int) []record {
	t.Helper()
	deadline := time.Now().Add(patience)
	for {
		running := map[int]record{}
		for _, r := range readRecords(t, file) {
			switch r.event {
			case "start":
				running[r.pid] = r
			case "end":
				delete(running, r.pid)
			}
		}
		if len(running) > limit {
			t.Fatalf("%d commands run at once: %+v; want at most %d", len(running), running, limit)
		}
		if len(running) == want {
			var rs []record
			for _, r := range running {
				rs = append(rs, r)
			}
			return rs
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: %d commands running after %v; want %d", file, len(running), patience, want)
		}
		time.Sleep(5 * time.Millisecond) // polling a file the children write, with a deadline
	}
}

// testReadWrite: two --shared runs hold the key together, while an
// --exclusive run with --wait 0 does not get it and the key's mutex and
// semaphore, other locks, are free; a waiting --exclusive run gets it once
// both readers ended, with a larger token, and keeps --shared runs out
// while it holds.
func testReadWrite(t *testing.T, k storeKind, url string) {
	key := uniqueKey(t)
	dir := t.TempDir()
	readers, writer, other := filepath.Join(dir, "readers"), filepath.Join(dir, "writer"), filepath.Join(dir, "other")
	r1 := start(t, nil, append([]string{"run", "--store", url, "--shared", key}, childCmd("-file", readers, "-hold", "stdin")...)...)
	r2 := start(t, nil, append([]string{"run", "--store", url, "--shared", key}, childCmd("-file", readers, "-hold", "stdin")...)...)
	holding := waitRunning(t, readers, 2, 2) // both hold the read side at once
	code, st := statusOf(t, url, key, "--shared")
	if code != 0 || st.Kind != "rwlock" {
		t.Errorf("status --shared while two readers hold: %d, kind %q; want 0, rwlock", code, st.Kind)
	}
	checkHolders(t, k, st, "read", holding)
	if code, out := statusText(t, url, key, "--exclusive"); code != 0 || !strings.Contains(out, "(read/write lock): held by 2 readers") {
		t.Errorf("status --exclusive while two readers hold: %d, output:\n%s", code, out)
	}
	for _, c := range []struct {
		flags []string
		code  int
	}{
		{[]string{"--exclusive", "--wait", "0"}, exitNotAcquired},
		{[]string{"--exclusive", "--wait", "100ms"}, exitNotAcquired},
		{[]string{"--wait", "0"}, 0},                 // the mutex KEY
		{[]string{"--limit", "1", "--wait", "0"}, 0}, // the semaphore KEY
	} {
		args := append(append([]string{"run", "--store", url}, c.flags...), key)
		if code, stderr := runDistlock(t, nil, append(args, childCmd("-file", other)...)...); code != c.code {
			t.Errorf("distlock %q while two readers hold the key: status %d; want %d; stderr:\n%s", c.flags, code, c.code, stderr)
		}
	}
	if n := len(readRecords(t, other)); n != 4 {
		t.Errorf("%d records of the other runs; want 4: the mutex's and the semaphore's runs, not the writers'", n)
	}
	w := start(t, nil, append([]string{"run", "--store", url, "--exclusive", "--wait", "2m", "-v", key},
		childCmd("-file", writer, "-hold", "stdin")...)...)
	w.waitLine("waiting for")
	for _, r := range []*proc{r1, r2} {
		if code := r.wait(); code != 0 {
			t.Errorf("reader: status %d; want 0; stderr:\n%s", code, r.errText())
		}
	}
	ws := waitRecord(t, writer, "start")
	code, st = statusOf(t, url, key, "--exclusive")
	if code != 0 {
		t.Errorf("status --exclusive while the writer holds: %d; want 0", code)
	}
	checkHolders(t, k, st, "write", []record{ws})
	if code, stderr := runDistlock(t, nil, append([]string{"run", "--store", url, "--shared", "--wait", "0", key},
		childCmd("-file", other)...)...); code != exitNotAcquired {
		t.Errorf("--shared --wait 0 while the writer holds: status %d; want %d; stderr:\n%s", code, exitNotAcquired, stderr)
	}
	if code := w.wait(); code != 0 {
		t.Errorf("writer: status %d; want 0; stderr:\n%s", code, w.errText())
	}
	for _, r := range readRecords(t, readers) {
		if r.event == "end" && r.at > ws.at {
			t.Errorf("a reader ended at %d, after the writer started at %d", r.at, ws.at)
		}
		if k.tokens && r.token >= ws.token {
			t.Errorf("the writer's token %d is not larger than a reader's %d", ws.token, r.token)
		}
	}
	if n := len(readRecords(t, other)); n != 4 {
		t.Errorf("%d records of the other runs; want 4: no reader ran while the writer held", n)
	}
}

// testLimitMismatch: while runs hold a semaphore with --limit 2, a run
// with --limit 3 exits 2 saying so, and does not run its command.
func testLimitMismatch(t *testing.T, url string) {
	key := uniqueKey(t)
	dir := t.TempDir()
	held, other := filepath.Join(dir, "held"), filepath.Join(dir, "other")
	holder := start(t, nil, append([]string{"run", "--store", url, "--limit", "2", key}, childCmd("-file", held, "-hold", "stdin")...)...)
	waitRecord(t, held, "start")
	code, stderr := runDistlock(t, nil, append([]string{"run", "--store", url, "--limit", "3", "--wait", "0", key}, childCmd("-file", other)...)...)
	if code != exitUsage || !strings.Contains(stderr, "--limit 3: the holders of the semaphore") {
		t.Errorf("--limit 3 while --limit 2 holds: status %d, stderr:\n%s\nwant %d and the limit mismatch", code, stderr, exitUsage)
	}
	if rs := readRecords(t, other); len(rs) != 0 {
		t.Errorf("the command of a run with another limit ran: %+v", rs)
	}
	if code := holder.wait(); code != 0 {
		t.Errorf("holder: status %d; want 0; stderr:\n%s", code, holder.errText())
	}
}

// testKindsRefused: on a store that holds no semaphores or read/write
// locks, --limit, --shared and --exclusive exit 2 saying so, and run
// nothing.
func testKindsRefused(t *testing.T, url string) {
	file := filepath.Join(t.TempDir(), "child")
	for _, flags := range [][]string{{"--limit", "2"}, {"--shared"}, {"--exclusive"}} {
		args := append(append([]string{"run", "--store", url}, flags...), uniqueKey(t))
		code, stderr := runDistlock(t, nil, append(args, childCmd("-file", file)...)...)
		if code != exitUsage || !strings.Contains(stderr, "holds mutexes only") {
			t.Errorf("distlock %q: status %d, stderr:\n%s\nwant %d and why", flags, code, stderr, exitUsage)
		}
	}
	if rs := readRecords(t, file); len(rs) != 0 {
		t.Errorf("a command ran: %+v", rs)
	}
}
