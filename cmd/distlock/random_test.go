//go:build unix

package main

import (
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/distlock/distlock/internal/testserver"
)

// TestRandomRuns races what distlock juggles: acquisitions on one key by
// concurrent runs, renewals (a short TTL), the command's start and exit,
// and signals sent to distlock at random moments, before, during and
// after its wait. Whatever the interleaving:
//   - commands never overlap, and each sees a larger token than the last;
//   - each run's exit status is the one its history gives: the command's
//     status if it exited, 128+N if the forwarded signal N ended it (the
//     command records which), and if it never started, the conflict
//     status (--wait 0) or 128+N (interrupted while waiting, or before
//     the command could start);
//   - the key is free once every run ended.
//
// DISTLOCK_TEST_SEED=n replays the plans of a run (the timing differs).
func TestRandomRuns(t *testing.T) {
	seed := uint64(time.Now().UnixNano())
	if s := os.Getenv("DISTLOCK_TEST_SEED"); s != "" {
		n, err := strconv.ParseUint(s, 10, 64)
		if err != nil {
			t.Fatalf("DISTLOCK_TEST_SEED=%q: %v", s, err)
		}
		seed = n
	}
	t.Logf("seed %d (DISTLOCK_TEST_SEED=%d replays the plans)", seed, seed)
	rng := rand.New(rand.NewPCG(seed, 0))
	url := "redis://" + testserver.Redis(t).Addr
	key := uniqueKey(t)
	file := filepath.Join(t.TempDir(), "runs")

	type plan struct {
		wait0    bool
		hold     time.Duration
		exit     int
		sig      syscall.Signal // 0: none
		sigAfter time.Duration
	}
	type result struct {
		plan
		pid, code int
		stderr    string
	}
	const workers, runs = 3, 6
	plans := make([][]plan, workers)
	for w := range plans {
		for range runs {
			p := plan{wait0: rng.IntN(3) == 0, hold: time.Duration(rng.IntN(200)) * time.Millisecond, exit: rng.IntN(4)}
			if rng.IntN(2) == 0 {
				p.sig = []syscall.Signal{syscall.SIGTERM, syscall.SIGINT, syscall.SIGHUP}[rng.IntN(3)]
				p.sigAfter = time.Duration(rng.IntN(400)) * time.Millisecond
			}
			plans[w] = append(plans[w], p)
		}
	}
	var (
		mu      sync.Mutex
		results []result
		wg      sync.WaitGroup
	)
	for w := range workers {
		wg.Go(func() {
			for _, pl := range plans[w] {
				wait := "30s"
				if pl.wait0 {
					wait = "0"
				}
				p := start(t, nil, append([]string{"run", "--store", url, "--ttl", "500ms", "--wait", wait, key},
					childCmd("-file", file, "-hold", pl.hold.String(), "-exit", strconv.Itoa(pl.exit), "-die")...)...)
				if pl.sig != 0 {
					timer := time.AfterFunc(pl.sigAfter, func() { p.cmd.Process.Signal(pl.sig) }) // an error once it exited: fine
					defer timer.Stop()
				}
				code := p.wait()
				mu.Lock()
				results = append(results, result{plan: pl, pid: p.cmd.Process.Pid, code: code, stderr: p.errText()})
				mu.Unlock()
			}
		})
	}
	wg.Wait()

	rs := readRecords(t, file)
	byDistlock := map[int][]record{}
	for i, r := range rs {
		byDistlock[r.ppid] = append(byDistlock[r.ppid], r)
		want := "start"
		if i%2 == 1 {
			want = "end"
		}
		if r.event != want || (i%2 == 1 && r.pid != rs[i-1].pid) {
			t.Fatalf("record %d is %+v; want the %s of the command before: commands overlapped\nrecords: %+v", i, r, want, rs)
		}
		if i%2 == 0 && i > 0 && r.token <= rs[i-2].token {
			t.Errorf("record %d: token %d after %d; want it larger", i, r.token, rs[i-2].token)
		}
	}
	started := 0
	for _, res := range results {
		own := byDistlock[res.pid]
		var allowed []int
		switch {
		case len(own) == 2:
			started++
			if how := own[1].how; how == "exit" {
				allowed = []int{res.exit}
			} else { // the forwarded signal ended it
				allowed = []int{128 + int(res.sig)}
				if names := map[syscall.Signal]string{syscall.SIGTERM: "TERM", syscall.SIGINT: "INT", syscall.SIGHUP: "HUP"}; names[res.sig] != how {
					t.Errorf("distlock %d was sent %v; its command was ended by %s", res.pid, res.sig, how)
				}
			}
		case len(own) == 0:
			if res.wait0 {
				allowed = append(allowed, exitNotAcquired)
			}
			if res.sig != 0 {
				allowed = append(allowed, 128+int(res.sig))
			}
		default:
			t.Errorf("distlock %d: its command left %d records; want 0 or 2: %+v", res.pid, len(own), own)
			continue
		}
		if !slices.Contains(allowed, res.code) {
			t.Errorf("distlock %d (plan %+v, command started: %v): status %d; want one of %v; stderr:\n%s",
				res.pid, res.plan, len(own) == 2, res.code, allowed, res.stderr)
		}
	}
	t.Logf("%d runs, %d commands started", len(results), started)
	if started == 0 {
		t.Error("no command started: the plans exercised nothing")
	}
	if code, stderr := runDistlock(t, nil, "run", "--store", url, "--wait", "0", key, "--", "true"); code != 0 {
		t.Errorf("after every run: the key is not free (status %d); stderr:\n%s", code, stderr)
	}
}
