package safety

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/distlock/distlock/backend"
	"github.com/distlock/distlock/safety/harness"
	"github.com/distlock/distlock/safety/history"
)

// kindsRun is a semaphore's or a read/write lock's run: a holder frozen
// past its expiry while the others go on, as testHolderPause does for a
// mutex.
type kindsRun struct {
	lock  string // the frozen holder's kind: "semaphore" or "write"
	limit int
	// others are the other workers' kinds.
	others []string
}

// testSemaphorePause: four workers share a semaphore of 2; one holder is
// frozen (SIGSTOP) for three times the expiry, writes once more with its
// old token when it wakes, and must see Done closed. The store must never
// have more than 2 live holders (polled by inspection, by its clock), the
// workers never more than 2 at once (counting holdings that ended by
// Unlock: the library held them valid throughout), no stale write may be
// accepted (each holder writes with its token: tokens increase with every
// grant), and no row may be left.
func testSemaphorePause(t *testing.T, tg target) {
	testKindsPause(t, tg, kindsRun{lock: "semaphore", limit: 2, others: []string{"semaphore", "semaphore", "semaphore"}})
}

// testRWPause: a writer frozen past its expiry while another writer and
// three readers go on. The store must never have a writer with another
// holder (inspection), nor the workers (holdings that ended by Unlock), no
// stale write may be accepted (only writers write), tokens increase across
// read and write grants, and no row may be left.
func testRWPause(t *testing.T, tg target) {
	testKindsPause(t, tg, kindsRun{lock: "write", others: []string{"write", "read", "read", "read"}})
}

func testKindsPause(t *testing.T, tg target, run kindsRun) {
	r := harness.NewRun(t)
	key := uniqueKey(t)
	cfg := func(name, lock string, n int) harness.Config {
		c := mixConfig(tg, key, n)
		c.Name, c.Lock, c.Limit = name, lock, run.limit
		return c
	}
	hcfg := cfg("holder", run.lock, 0)
	hcfg.Cycles, hcfg.Ops, hcfg.Hold, hcfg.Zombie = 1, 10000, 10000*tg.ttl/4, true
	holder := r.Worker(hcfg)
	if _, err := holder.WaitLine("acquired", 0, 60*time.Second); err != nil {
		t.Fatal(err)
	}
	waitUntil(t, 30*time.Second, "the holder's first write", func() bool { return accepted(r, "holder-", 0) })

	// The store's own view, by its clock, polled all along.
	res0, closeRes, err := tg.backend.Open(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	defer closeRes()
	mon := startKindMonitor(t, res0.(backend.Inspector), key, run)

	var others []*harness.Worker
	for i, lock := range run.others {
		w := r.Worker(cfg(fmt.Sprintf("%c%d", lock[0], i), lock, i+1))
		if _, err := w.WaitLine("ready", 0, 60*time.Second); err != nil {
			t.Fatal(err)
		}
		others = append(others, w)
	}
	pauseAt := r.Note("SIGSTOP holder")
	holder.Pause()
	waitAcquisitions(t, tg, 3, others...)
	if d := time.Duration(pauseAt+int64(3*tg.expiry)-history.Now()) * time.Nanosecond; d > 0 {
		time.Sleep(d) // the fault's length: the pause lasts 3x the expiry
	}
	resumeAt := r.Note("SIGCONT holder")
	holder.Resume()
	if _, err := holder.WaitLine("lost", 0, 30*time.Second); err != nil {
		t.Fatalf("the holder's Done did not close on wake: %v", err)
	}
	waitAcquisitions(t, tg, 10*soak, others...)
	stopAll(t, tg, append(others, holder)...)
	storeMax, storeBad := mon.stop()

	evs := r.History()
	fault := "read/write lock: writer SIGSTOP 3x expiry"
	if run.lock == "semaphore" {
		fault = fmt.Sprintf("semaphore (limit %d): holder SIGSTOP 3x expiry", run.limit)
	}
	res := harness.Check(t, tg.name, fault, evs)
	res.Orphans = orphans(t, tg, key)
	if lost, ok := lostOf(evs, "holder-0"); ok {
		res.LossLatency = time.Duration(lost.At - resumeAt)
	}
	if first, ok := firstAcquisitionAfter(evs, pauseAt); ok {
		res.Recovery = time.Duration(first.Return - pauseAt)
	}
	// Porcupine's model is a fenced mutex, which a semaphore's or a
	// read/write lock's legitimate overlaps do not fit.
	res.Linearizable, res.Visualization = "", ""
	workersMax, workersBad := kindViolations(evs, run)
	switch run.lock {
	case "semaphore":
		res.Notes = fmt.Sprintf("%d workers; holders at once: at most %d by the store's clock (inspection every 5ms), %d as the workers held them; loss latency from SIGCONT, recovery from SIGSTOP", 1+len(run.others), storeMax, workersMax)
	default:
		res.Notes = fmt.Sprintf("2 writers, 3 readers; a writer with another holder: %d times by the store's clock (inspection every 5ms), %d as the workers held them; at most %d readers at once; loss latency from SIGCONT, recovery from SIGSTOP", storeBad, workersBad, storeMax)
	}
	res.Log(t)
	if len(res.Stale) != 0 {
		t.Errorf("%d stale writes accepted; want 0", len(res.Stale))
	}
	if len(res.TokenIssues) != 0 {
		t.Errorf("%d token issues; want 0: %v", len(res.TokenIssues), res.TokenIssues[0])
	}
	if storeBad != 0 || workersBad != 0 {
		t.Errorf("the lock's bound broken %d times by the store's clock and %d times in the workers' holdings; want 0", storeBad, workersBad)
	}
	if res.Orphans != 0 {
		t.Errorf("%d orphans; want 0", res.Orphans)
	}
	if res.Acquisitions < 5 {
		t.Errorf("%d acquisitions: the run measured too little", res.Acquisitions)
	}
}

// kindMonitor polls a lock's holders by inspection, by the store's clock.
type kindMonitor struct {
	cancel context.CancelFunc
	done   chan struct{}
	max    int // semaphore: holders; read/write: readers
	bad    int // samples with more holders than the limit, or a writer with another
	errs   int
}

func startKindMonitor(t *testing.T, in backend.Inspector, key string, run kindsRun) *kindMonitor {
	ctx, cancel := context.WithCancel(context.Background())
	m := &kindMonitor{cancel: cancel, done: make(chan struct{})}
	kind := backend.KindWrite
	if run.lock == "semaphore" {
		kind = backend.KindSemaphore
	}
	go func() {
		defer close(m.done)
		tick := time.NewTicker(5 * time.Millisecond)
		defer tick.Stop()
		for {
			got, err := in.Inspect(ctx, key, kind)
			switch {
			case err != nil:
				if ctx.Err() == nil {
					m.errs++
				}
			case kind == backend.KindSemaphore:
				m.max = max(m.max, len(got.Holders))
				if len(got.Holders) > run.limit {
					m.bad++
					t.Logf("inspection: %d holders of a semaphore of %d: %+v", len(got.Holders), run.limit, got.Holders)
				}
			default:
				writers := 0
				for _, h := range got.Holders {
					if h.Kind == backend.KindWrite {
						writers++
					}
				}
				m.max = max(m.max, len(got.Holders)-writers)
				if writers > 0 && len(got.Holders) > 1 {
					m.bad++
					t.Logf("inspection: a writer with others: %+v", got.Holders)
				}
			}
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
			}
		}
	}()
	return m
}

func (m *kindMonitor) stop() (maxSeen, bad int) {
	m.cancel()
	<-m.done
	return m.max, m.bad
}

// kindViolations counts, among the holdings that ended by Unlock (the
// library held them valid throughout), the most held at once (semaphore)
// and the moments the lock's bound was broken: more than the limit at
// once, or a writer's holding intersecting another holding. Workers named
// "r..." read; the others write (or hold a permit).
func kindViolations(evs []history.Event, run kindsRun) (most, bad int) {
	var ivs []history.Interval
	for _, iv := range history.Intervals(evs) {
		if iv.EndedBy == "unlock" {
			ivs = append(ivs, iv)
		}
	}
	reader := func(iv history.Interval) bool { return strings.HasPrefix(iv.Proc, "r") }
	for i, a := range ivs {
		n := 1
		for j, b := range ivs {
			if i == j || b.Start > a.Start || b.End <= a.Start {
				continue
			}
			n++ // b holds at a's start
			if run.lock != "semaphore" && !(reader(a) && reader(b)) {
				bad++
			}
		}
		most = max(most, n)
		if run.lock == "semaphore" && n > run.limit {
			bad++
		}
	}
	return most, bad
}
