package sqldb

import (
	"testing"
	"time"

	"github.com/distlock/distlock/backend"
	"github.com/distlock/distlock/testsuite"
)

// The queue of a mutex's or semaphore's waiters, on the store's own calls
// (the facade's use of them is the conformance suite's).

// attempt makes one TryAcquire of l and reports whether it held.
func attempt(t *testing.T, r resource, l *backend.Lease) (bool, time.Duration) {
	t.Helper()
	ok, left, err := r.TryAcquire(t.Context(), l)
	if err != nil {
		t.Fatalf("TryAcquire(%q, %s) = %v", l.Key, l.Value, err)
	}
	return ok, left
}

// mustRelease releases l.
func mustRelease(t *testing.T, r resource, l *backend.Lease) {
	t.Helper()
	if err := r.Release(t.Context(), l); err != nil {
		t.Fatalf("Release(%q, %s) = %v", l.Key, l.Value, err)
	}
}

// noticed waits for a notice on ch.
func noticed(t *testing.T, ch <-chan struct{}, what string) {
	t.Helper()
	select {
	case <-ch:
	case <-time.After(10 * time.Second):
		t.Fatalf("no notice for %s", what)
	}
}

// drain empties ch.
func drain(ch <-chan struct{}) {
	for {
		select {
		case <-ch:
		default:
			return
		}
	}
}

// listening subscribes to p's notices for the test's length and waits
// until its LISTEN connection is up (it wakes every subscriber once then).
func listening(t *testing.T, p *Postgres) {
	t.Helper()
	ch, cancel := p.ln.subscribeWaiter(testsuite.Key(t))
	t.Cleanup(cancel)
	noticed(t, ch, "the LISTEN connection coming up")
}

// noticeBarrier sends a notice addressed to a subscriber of its own through the
// server and waits for it: the notices sent before it have arrived (one
// connection delivers them in order), so the channels that have none got
// none.
func noticeBarrier(t *testing.T, p *Postgres) {
	t.Helper()
	owner := testsuite.Key(t)
	ch, cancel := p.ln.subscribeWaiter(owner)
	defer cancel()
	if _, err := p.pool.Exec(t.Context(), `SELECT pg_notify($1, $2)`, p.ln.qchannel, owner); err != nil {
		t.Fatal(err)
	}
	noticed(t, ch, "the fence")
}

// testQueueOrder: the waiters of a mutex or a semaphore (limit 2), from
// different resources as from processes, are granted in the order they
// first tried, whatever order they try again in; a release wakes only the
// waiter it lets in, in whichever process it waits.
func testQueueOrder(t *testing.T, pg *pgFixture, kind backend.Kind) {
	limit := 0
	if kind == backend.KindSemaphore {
		limit = 2
	}
	key := testsuite.Key(t)
	res := make([]*Postgres, 3)
	for i := range res {
		res[i] = pg.resource(t, pg.pool(t, nil))
	}
	owner := map[*backend.Lease]*Postgres{}
	lease := func(p *Postgres) *backend.Lease {
		l := newLease(t, key, time.Minute)
		l.Kind, l.Limit, l.Waits = kind, limit, true
		owner[l] = p
		return l
	}
	var releasers []*backend.Lease
	for range max(limit, 1) {
		h := lease(res[0])
		mustAcquire(t, res[0], h)
		releasers = append(releasers, h)
	}
	// Five waiters arrive in order, spread over the processes, and
	// subscribe where they wait.
	ws := make([]*backend.Lease, 5)
	for i := range ws {
		ws[i] = lease(res[i%3])
		if ok, left := attempt(t, owner[ws[i]], ws[i]); ok || left <= 0 {
			t.Fatalf("waiter %d: acquired %v, time left %v; want false and a time left", i, ok, left)
		}
	}
	for _, p := range res {
		listening(t, p)
	}
	chs := make([]<-chan struct{}, len(ws))
	for i, w := range ws {
		ch, cancel := owner[w].ln.subscribeWaiter(w.Value)
		t.Cleanup(cancel)
		chs[i] = ch
	}
	var last uint64
	for i, w := range ws {
		mustRelease(t, owner[releasers[i]], releasers[i])
		noticed(t, chs[i], "the head's wake-up")
		for _, p := range res {
			noticeBarrier(t, p)
		}
		for j := i + 1; j < len(ws); j++ {
			select {
			case <-chs[j]:
				t.Fatalf("release %d woke waiter %d; want only waiter %d, the head", i, j, i)
			default:
			}
		}
		// The others try again first, last comer first: none holds.
		for j := len(ws) - 1; j > i; j-- {
			if ok, _ := attempt(t, owner[ws[j]], ws[j]); ok {
				t.Fatalf("waiter %d acquired before waiter %d, which came first", j, i)
			}
		}
		drain(chs[i])
		if ok, _ := attempt(t, owner[w], w); !ok {
			t.Fatalf("waiter %d, first in line, not granted", i)
		}
		if w.Token <= last {
			t.Fatalf("waiter %d's token %d; want above %d", i, w.Token, last)
		}
		last = w.Token
		releasers = append(releasers, w)
	}
	for _, l := range releasers[len(ws):] {
		mustRelease(t, owner[l], l)
	}
	wantRows(t, pg.fixture(), key)
}
