package sqldb

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/distlock/distlock"
	"github.com/distlock/distlock/backend"
	"github.com/distlock/distlock/internal/testserver/proxy"
	"github.com/distlock/distlock/testsuite"
)

// The queue of a mutex's waiters, on the store's own calls
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

// testQueueOrder: the waiters of a mutex, from different resources as
// from processes, are granted in the order they first tried, whatever
// order they try again in; a release wakes only the waiter it lets in, in
// whichever process it waits. (A semaphore's release wakes every waiter
// of the key: its line is testSemaphoreLine.)
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
		l.Kind, l.Limit, l.Waits = kind, int32(limit), true
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
	if kind == backend.KindMutex {
		if n, err := pg.requests(t.Context(), key, kind); err != nil || n != 1+len(ws) {
			t.Fatalf("requests kept = %d, %v; want the holder and %d waiters", n, err, len(ws))
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

// queued returns how many live intents wait in the row of key's mutex.
func (f *pgFixture) queued(t *testing.T, key string) int {
	t.Helper()
	var n int
	err := f.admin.QueryRow(t.Context(), `SELECT count(*) FROM distlock_locks l, jsonb_array_elements(l.queue) x
WHERE l.lock_key = $1 AND (x->>'e')::bigint > (extract(epoch FROM now()) * 1000000)::bigint`, key).Scan(&n)
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// waitQueued polls until n intents wait for key's mutex.
func (f *pgFixture) waitQueued(t *testing.T, key string, n int) {
	t.Helper()
	eventually(t, 10*time.Second, fmt.Sprintf("%d waiters queued", n), func() (bool, error) { return f.queued(t, key) == n, nil })
}

// waitFor makes a TryLock of key on d with a wait of 30s in a goroutine,
// and sends when it got the lock (the zero time if it failed, failing t)
// once it unlocked it. The test waits for it before it ends.
func waitFor(t *testing.T, d *distlock.DistributeLock, key string) <-chan time.Time {
	got := make(chan time.Time, 1)
	done := make(chan error, 1)
	ctx, cancel := context.WithCancel(context.Background())
	go func() {
		lk, err := d.TryLock(ctx, key, 30*time.Second)
		if err != nil {
			got <- time.Time{}
			done <- err
			return
		}
		at := time.Now()
		err = lk.Unlock(context.Background())
		got <- at
		done <- err
	}()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("waiter: %v", err)
		}
	})
	return got
}

// testDeadHeadPassedOver: the head of the queue died (it queued, and
// never comes back): the lock kept for it after the release goes to the
// next waiter, through the facade, once the dead head's intent lapses,
// and within backend.HeadPoll of it, the longest a waiter sleeps unwoken.
// (That the waiter is told to come back at the lapse itself, sooner, is
// testHintLastLapseAhead's: a time measured here, under -race beside
// other packages, came 1.73s after the lapse.)
func testDeadHeadPassedOver(t *testing.T, pg *pgFixture) {
	const deadTTL = 300 * time.Millisecond
	key := testsuite.Key(t)
	a := pg.resource(t, pg.pool(t, nil))
	holder := newLease(t, key, time.Minute)
	mustAcquire(t, a, holder)
	dead := newLease(t, key, time.Minute) // until the waiter queued
	dead.Waits = true
	if ok, _ := attempt(t, a, dead); ok {
		t.Fatal("the dead head acquired a held lock")
	}
	d, err := distlock.New(pg.resource(t, pg.pool(t, nil)))
	if err != nil {
		t.Fatal(err)
	}
	got := waitFor(t, d, key)
	pg.waitQueued(t, key, 2)
	// Renew the dead head's intent once more, for deadTTL, then leave
	// it: it lapses deadTTL from the statement's start by the server's
	// clock, which is after sent (same machine's clock).
	dead.TTL = deadTTL
	sent := time.Now()
	if ok, _ := attempt(t, a, dead); ok {
		t.Fatal("the dead head acquired a held lock")
	}
	lapse := sent.Add(deadTTL)
	mustRelease(t, a, holder)
	// A newcomer is refused the lock kept for the head, and queues
	// behind the waiter (which will wake it).
	probe := newLease(t, key, time.Minute)
	probe.Waits = true
	if ok, left := attempt(t, a, probe); ok || left <= 0 {
		t.Errorf("a newcomer's attempt = %v, time left %v; want refused, and a time to come back", ok, left)
	}
	if err := a.Withdraw(t.Context(), probe); err != nil {
		t.Fatal(err)
	}
	at := <-got
	switch {
	case at.IsZero():
	case at.Before(lapse):
		t.Errorf("the waiter behind the head got the lock %v before the head's intent lapsed", lapse.Sub(at))
	case at.Sub(lapse) > backend.HeadPoll:
		t.Errorf("the waiter got the lock %v after the dead head's intent lapsed; want within %v, the longest a waiter sleeps unwoken", at.Sub(lapse), backend.HeadPoll)
	}
	wantRows(t, pg.fixture(), key)
}

// testHeadWithdraws: the head of the queue, kept the lock by a release,
// gives up (the facade withdraws its intent): the next waiter is woken at
// once, not when the head's intent would have lapsed nor at HeadPoll.
func testHeadWithdraws(t *testing.T, pg *pgFixture) {
	key := testsuite.Key(t)
	a := pg.resource(t, pg.pool(t, nil))
	holder := newLease(t, key, time.Minute)
	mustAcquire(t, a, holder)
	head := newLease(t, key, time.Minute)
	head.Waits = true
	if ok, _ := attempt(t, a, head); ok {
		t.Fatal("the head acquired a held lock")
	}
	d, err := distlock.New(pg.resource(t, pg.pool(t, nil)))
	if err != nil {
		t.Fatal(err)
	}
	got := waitFor(t, d, key)
	pg.waitQueued(t, key, 2)
	mustRelease(t, a, holder) // kept for the head
	if ok, _ := attempt(t, pg.resource(t, pg.pool(t, nil)), newLease(t, key, time.Minute)); ok {
		t.Fatal("a newcomer took the lock kept for the head")
	}
	t0 := time.Now()
	if err := a.Withdraw(t.Context(), head); err != nil {
		t.Fatal(err)
	}
	if at := <-got; !at.IsZero() && at.Sub(t0) > time.Second {
		t.Errorf("the next waiter got the lock %v after the head withdrew; want within a second (HeadPoll %v)", at.Sub(t0), backend.HeadPoll)
	}
	wantRows(t, pg.fixture(), key)
}

// requests counts the requests PostgreSQL keeps for key's lock of kind:
// its live holders and its queued waiters' live intents (the conformance
// suite's ArrivalOrder case).
func (f *pgFixture) requests(ctx context.Context, key string, kind backend.Kind) (int, error) {
	live := `(x->>'e')::bigint > (extract(epoch FROM now()) * 1000000)::bigint`
	var n int
	var err error
	switch {
	case kind == backend.KindMutex && textKey(key):
		err = f.admin.QueryRow(ctx, `SELECT coalesce(sum((expires_at > now())::int
  + (SELECT count(*) FROM jsonb_array_elements(queue) x WHERE `+live+`)), 0)::int FROM distlock_locks WHERE lock_key = $1`, key).Scan(&n)
	case kind == backend.KindMutex:
		err = f.admin.QueryRow(ctx, `SELECT coalesce(sum((expires_at > now())::int
  + (SELECT count(*) FROM jsonb_array_elements(state) x WHERE `+live+`)), 0)::int FROM distlock_locks_kinds WHERE lock_key = $1 AND kind = 0`, []byte(key)).Scan(&n)
	case kind == backend.KindSemaphore:
		err = f.admin.QueryRow(ctx, `SELECT coalesce(sum((SELECT count(*) FROM jsonb_array_elements(state->'h') x WHERE `+live+`)
  + (SELECT count(*) FROM jsonb_array_elements(state->'i') x WHERE `+live+`)), 0)::int FROM distlock_locks_kinds WHERE lock_key = $1 AND kind = 1`, []byte(key)).Scan(&n)
	default:
		return 0, fmt.Errorf("requests of a %v: %w", kind, errors.ErrUnsupported)
	}
	return n, err
}

// testIntentLapsesWithWait: a waiter's intent lasts no longer than its
// acquisition's context has left, whatever its TTL: a waiter that left
// without withdrawing (or whose last attempt, abandoned at the end of its
// wait, committed after its withdrawal) does not hold up the queue behind
// it for its TTL.
func testIntentLapsesWithWait(t *testing.T, pg *pgFixture) {
	key := testsuite.Key(t)
	a := pg.resource(t, pg.pool(t, nil))
	holder := newLease(t, key, time.Minute)
	mustAcquire(t, a, holder)
	t.Cleanup(func() { _ = a.Release(context.Background(), holder) })
	w := newLease(t, key, time.Minute)
	w.Waits = true
	ctx, cancel := context.WithTimeout(t.Context(), 300*time.Millisecond)
	defer cancel()
	ok, _, err := a.TryAcquire(ctx, w)
	if err != nil || ok {
		t.Fatalf("a waiter's attempt on a held lock = %v, %v; want refused", ok, err)
	}
	if n := pg.queued(t, key); n != 1 {
		t.Fatalf("%d intents queued after the attempt; want 1", n)
	}
	// The waiter never withdraws: its intent lapses when its context ends.
	pg.waitQueued(t, key, 0)
}

// testShortHoldsAllAtOnce: 3 resources (as processes) x 4 goroutines, all
// released at once, contend for one key through the facade, each holding
// 1ms and waiting 200ms (shorter than MinQueueWait: they do not line
// up). A stall (a lock kept for a head that left, taken by an attempt cut
// off at the end of its wait and held until its clean-up, or a pool
// emptied by cut-off connections) refuses nearly every request.
func testShortHoldsAllAtOnce(t *testing.T, pg *pgFixture) {
	const procs, workers, rounds = 3, 4, 50
	key := testsuite.Key(t)
	var ds []*distlock.DistributeLock
	for range procs {
		d, err := distlock.New(pg.resource(t, pg.pool(t, nil)))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = d.Close() })
		ds = append(ds, d)
	}
	var (
		granted, refused, unanswered, holders atomic.Int64
		wg                                    sync.WaitGroup
		start                                 = make(chan struct{})
	)
	errs := make(chan error, procs*workers*rounds)
	for _, d := range ds {
		for range workers {
			wg.Go(func() {
				<-start
				for range rounds {
					lk, err := d.TryLock(context.Background(), key, 200*time.Millisecond)
					switch {
					case errors.Is(err, distlock.ErrNotAcquired):
						refused.Add(1)
						continue
					case errors.Is(err, context.DeadlineExceeded):
						unanswered.Add(1) // no answer within the wait: a loaded machine
						continue
					case err != nil:
						errs <- err
						continue
					}
					granted.Add(1)
					if holders.Add(1) != 1 {
						errs <- errors.New("two holders at once")
					}
					time.Sleep(time.Millisecond) // the hold
					holders.Add(-1)
					if err := lk.Unlock(context.Background()); err != nil {
						errs <- err
					}
				}
			})
		}
	}
	close(start)
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	total := int64(procs * workers * rounds)
	t.Logf("granted %d of %d, refused %d, unanswered %d", granted.Load(), total, refused.Load(), unanswered.Load())
	// A stall grants a handful and refuses the rest (1 to 23 of 600
	// were seen). A loaded machine leaves requests unanswered within
	// 200ms (the store is slow, not the queue stuck): of the requests
	// the store answered, a fifth and more were granted on a loaded
	// 2-core machine under -race.
	if answered := granted.Load() + refused.Load(); granted.Load()*10 < answered {
		t.Errorf("granted %d of %d answered requests; want at least a tenth", granted.Load(), answered)
	}
}

// testHintLastLapseAhead: a refused waiter is told to come back when
// every intent ahead of its own will have lapsed (or the holder's lease
// ends), not at the first lapse ahead: while one ahead lives, its release
// or withdrawal wakes the next. Waking at each lapse ahead, every waiter
// tried again as each waiter ahead of it reached the end of its wait.
// The second in line is still told the head's lapse (a dead head is
// passed over then).
func testHintLastLapseAhead(t *testing.T, pg *pgFixture) {
	key := testsuite.Key(t)
	a := pg.resource(t, pg.pool(t, nil))
	holder := newLease(t, key, time.Minute)
	mustAcquire(t, a, holder)
	t.Cleanup(func() { _ = a.Release(context.Background(), holder) })
	queue := func(l *backend.Lease, ctx context.Context) time.Duration {
		t.Helper()
		l.Waits = true
		ok, left, err := a.TryAcquire(ctx, l)
		if ok || err != nil {
			t.Fatalf("a waiter's attempt on a held lock = %v, %v; want refused", ok, err)
		}
		t.Cleanup(func() { _ = a.Withdraw(context.Background(), l) })
		return left
	}
	short, cancel := context.WithTimeout(t.Context(), 5*time.Second)
	defer cancel()
	first := newLease(t, key, time.Minute)
	queue(first, short) // its intent lapses within 5s
	second := newLease(t, key, time.Minute)
	queue(second, t.Context()) // a minute
	third := newLease(t, key, time.Minute)
	if left := queue(third, t.Context()); left < 30*time.Second {
		t.Errorf("the third in line is told to come back in %v; want about a minute: the second's intent lives that long", left)
	}
	if left := queue(second, t.Context()); left > 5*time.Second || left <= 0 {
		t.Errorf("the second in line is told to come back in %v; want within 5s, when the head's intent lapses", left)
	}
}

// testWithdrawnInFlight: a waiter's attempt is abandoned with its
// statement in flight (held on the way to the server by a proxy), the
// waiter withdraws, and only then does the statement reach the server:
// it must neither queue the waiter again (Held: the lock held) nor take
// the lock (Freed: the holder released meanwhile), and the clean-up,
// once the statement settled, leaves no row of the waiter behind. Late:
// the withdrawal (slower than the facade waits for) comes only after the
// clean-up, and must then leave no marker (which would keep the row
// after the holder's release).
func testWithdrawnInFlight(t *testing.T, pg *pgFixture) {
	t.Run("Held", func(t *testing.T) { withdrawnInFlight(t, pg, false, false) })
	t.Run("Freed", func(t *testing.T) { withdrawnInFlight(t, pg, true, false) })
	t.Run("Late", func(t *testing.T) { withdrawnInFlight(t, pg, false, true) })
}

func withdrawnInFlight(t *testing.T, pg *pgFixture, freed, late bool) {
	pool, px := pg.proxiedPool(t, func(c *pgxpool.Config) { c.MinConns, c.MaxConns = 1, 1 })
	r := pg.resource(t, pool)
	a := pg.resource(t, pg.pool(t, nil))
	key := testsuite.Key(t)
	holder := newLease(t, key, time.Minute)
	mustAcquire(t, a, holder)
	t.Cleanup(func() { _ = a.Release(context.Background(), holder) })
	w := newLease(t, key, time.Minute)
	w.Waits = true
	if ok, _ := attempt(t, r, w); ok {
		t.Fatal("the waiter acquired a held lock")
	}
	requests := func() int {
		t.Helper()
		n, err := pg.requests(t.Context(), key, backend.KindMutex)
		if err != nil {
			t.Fatal(err)
		}
		return n
	}
	if n := requests(); n != 2 {
		t.Fatalf("the store keeps %d requests after the waiter queued; want 2", n)
	}
	// The server process of the one connection: gone once it has run
	// whatever reached it and read the connection's end.
	c, err := r.pool.Acquire(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	pid := c.Conn().PgConn().PID()
	c.Release()

	// The next attempt is held on its way and abandoned.
	held := px.Hold(proxy.Up, func(b []byte) bool { return bytes.Contains(b, []byte(w.Value)) })
	defer held.Release()
	ctx, cancel := context.WithCancel(t.Context())
	go func() {
		select {
		case <-held.Seen():
		case <-time.After(10 * time.Second):
		}
		cancel()
	}()
	_, _, err = r.TryAcquire(ctx, w)
	var ab *backend.AbandonedError
	if !errors.As(err, &ab) {
		t.Fatalf("TryAcquire with its statement held = %v; want an AbandonedError", err)
	}
	select {
	case <-held.Seen():
	default:
		t.Fatal("the attempt's statement never reached the proxy")
	}
	// The facade withdraws the waiter before the statement arrives (on
	// another connection: the pool's one is closing, and pgx drains it
	// until the server closes its end, which waits for the held bytes).
	if !late {
		if err := a.Withdraw(t.Context(), w); err != nil {
			t.Fatal(err)
		}
	}
	want := 1
	if freed {
		mustRelease(t, a, holder)
		want = 0
	}
	if n := requests(); !late && n != want {
		t.Fatalf("the store keeps %d requests after the withdrawal; want %d", n, want)
	}
	// Now the statement arrives and runs.
	held.Release()
	deadline := time.Now().Add(10 * time.Second)
	for {
		var alive bool
		if err := pg.admin.QueryRow(t.Context(), `SELECT EXISTS (SELECT FROM pg_stat_activity WHERE pid = $1)`, int64(pid)).Scan(&alive); err != nil {
			t.Fatal(err)
		}
		if !alive {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the abandoned statement's server process still runs after 10s")
		}
		time.Sleep(5 * time.Millisecond)
	}
	if n := requests(); !late && n != want {
		t.Fatalf("the store keeps %d requests after the withdrawn waiter's statement ran; want %d (the withdrawal's %d)", n, want, want)
	}
	cctx, ccancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer ccancel()
	if err := ab.Cleanup(cctx); err != nil {
		t.Fatalf("Cleanup: %v", err)
	}
	if late {
		if err := a.Withdraw(t.Context(), w); err != nil {
			t.Fatal(err)
		}
		mustRelease(t, a, holder)
		wantRows(t, pg.fixture(), key)
		return
	}
	if freed {
		wantRows(t, pg.fixture(), key)
	} else {
		wantRows(t, pg.fixture(), key, holder.Value)
	}
}

// testHandoffStatements counts the statements of a handoff through the
// line: the release of a lock granted with nobody waiting to an
// acquisition that waits in line (Waits), once a waiter has queued
// behind it, makes two (the common delete, then the one that frees the
// row and wakes the head), as a release with waiters makes on a store
// without a line; the head's attempt makes one and takes the lock; its
// release, nobody left behind, makes one.
func testHandoffStatements(t *testing.T, pg *pgFixture) {
	tr := &tracer{}
	p := pg.resource(t, pg.pool(t, tracedPool(tr, nil)))
	key := testsuite.Key(t)
	holder := newLease(t, key, time.Minute)
	holder.Waits = true
	mustAcquire(t, p, holder)
	head := newLease(t, key, time.Minute)
	head.Waits = true
	if ok, _ := attempt(t, p, head); ok {
		t.Fatal("the waiter acquired a held lock")
	}
	count := func(what string, want int) {
		t.Helper()
		if got := tr.reset(); len(got) != want {
			var sqls []string
			for _, s := range got {
				q := strings.Join(strings.Fields(s.sql), " ")
				sqls = append(sqls, q[:min(len(q), 60)])
			}
			t.Errorf("%s made %d statements; want %d: %q", what, len(got), want, sqls)
		}
	}
	tr.reset()
	mustRelease(t, p, holder)
	count("the release with a waiter queued", 2)
	if ok, _ := attempt(t, p, head); !ok {
		t.Fatal("the head did not get the lock kept for it")
	}
	count("the head's attempt", 1)
	mustRelease(t, p, head)
	count("the head's release", 1)
	wantRows(t, pg.fixture(), key)
}

// testEndAfterReply: an attempt's context ends after its reply came but
// before TryAcquire looked (afterAttempt), and the reply was no row (a
// later contender for a held lock): the outcome is known, contention, and
// the connection goes back to the pool without the deadline that ctx's
// end set on it, so the next statement on it works. (That deadline was
// left on connections whose attempt got no row: their next statement
// failed at once with "timeout: write failed", and ShortHoldsAllAtOnce
// stalled.)
func testEndAfterReply(t *testing.T, pg *pgFixture) {
	a := pg.resource(t, pg.pool(t, nil))
	r := pg.resource(t, pg.pool(t, func(c *pgxpool.Config) { c.MinConns, c.MaxConns = 1, 1 }))
	key := testsuite.Key(t)
	holder := newLease(t, key, time.Minute)
	mustAcquire(t, a, holder)
	t.Cleanup(func() { _ = a.Release(context.Background(), holder) })
	if ok, _ := attempt(t, a, newLease(t, key, time.Minute)); ok {
		t.Fatal("a contender took a held lock")
	}
	ctx, cancel := context.WithCancel(t.Context())
	afterAttempt = cancel
	ok, _, err := r.TryAcquire(ctx, newLease(t, key, time.Minute))
	afterAttempt = nil
	if ok || err != nil {
		t.Fatalf("TryAcquire of a held lock whose context ended after the reply = %v, %v; want false, nil (contention)", ok, err)
	}
	if ok, _, err := r.TryAcquire(t.Context(), newLease(t, key, time.Minute)); ok || err != nil {
		t.Fatalf("the next TryAcquire on the same connection = %v, %v; want false, nil", ok, err)
	}
}

// testUncancellableWaiterQueues: a waiter whose caller cannot cancel it
// (context.Background(): the facade hands the store a bounded context
// without cancellation, and the connection's deadline carries the bound)
// joins the line as any waiter of a second or more does.
func testUncancellableWaiterQueues(t *testing.T, pg *pgFixture) {
	key := testsuite.Key(t)
	a := pg.resource(t, pg.pool(t, nil))
	holder := newLease(t, key, time.Minute)
	mustAcquire(t, a, holder)
	d, err := distlock.New(pg.resource(t, pg.pool(t, nil)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = d.Close() })
	got := make(chan error, 1)
	go func() {
		lk, err := d.TryLock(context.Background(), key, 30*time.Second)
		if err == nil {
			err = lk.Unlock(context.Background())
		}
		got <- err
	}()
	pg.waitQueued(t, key, 1)
	mustRelease(t, a, holder)
	if err := <-got; err != nil {
		t.Fatal(err)
	}
	wantRows(t, pg.fixture(), key)
}

// testSemaphoreLine: a semaphore's waiters that wait in line
// (Lease.Waits), from different resources as from processes, are granted
// freed permits in the order they first tried, whatever order they try
// again in: two permits freed at once go to the first two; a single
// attempt (no intent) is refused a permit a waiter in line waits for,
// and queues nothing; an attempt refused for another limit queues
// nothing; a waiter that withdrew holds nobody back.
func testSemaphoreLine(t *testing.T, f fixture) {
	key := testsuite.Key(t)
	res := []resource{f.newResource(t), f.newResource(t), f.newResource(t)}
	owner := map[*backend.Lease]resource{}
	lease := func(r resource, waits bool) *backend.Lease {
		l := newLease(t, key, time.Minute)
		l.Kind, l.Limit, l.Waits = backend.KindSemaphore, 2, waits
		owner[l] = r
		return l
	}
	requests := func(want int, when string) {
		t.Helper()
		if n, err := f.requests(t.Context(), key, backend.KindSemaphore); err != nil || n != want {
			t.Fatalf("%s: requests kept = %d, %v; want %d", when, n, err, want)
		}
	}
	h1, h2 := lease(res[0], false), lease(res[1], false)
	mustAcquire(t, res[0], h1)
	mustAcquire(t, res[1], h2)
	ws := make([]*backend.Lease, 5)
	for i := range ws {
		ws[i] = lease(res[i%3], true)
		if ok, left := attempt(t, owner[ws[i]], ws[i]); ok || left <= 0 {
			t.Fatalf("waiter %d: acquired %v, time left %v; want false and a time left", i, ok, left)
		}
	}
	requests(2+len(ws), "2 holders, 5 waiters")
	other := lease(res[2], true)
	other.Limit = 3
	if _, _, err := res[2].TryAcquire(t.Context(), other); !errors.Is(err, backend.ErrLimitMismatch) {
		t.Fatalf("an attempt with limit 3 on a semaphore held with 2: %v; want ErrLimitMismatch", err)
	}
	requests(2+len(ws), "after an attempt with another limit")

	mustRelease(t, res[0], h1)
	mustRelease(t, res[1], h2)
	if ok, _ := attempt(t, res[2], lease(res[2], false)); ok {
		t.Fatal("a single attempt took a permit that waiters in line wait for")
	}
	requests(len(ws), "after the releases and a single attempt")
	var last uint64
	grant := func(i int) {
		t.Helper()
		if ok, _ := attempt(t, owner[ws[i]], ws[i]); !ok {
			t.Fatalf("waiter %d not granted a permit", i)
		}
		if ws[i].Token <= last {
			t.Fatalf("waiter %d's token %d; want above %d", i, ws[i].Token, last)
		}
		last = ws[i].Token
	}
	refused := func(i int) {
		t.Helper()
		if ok, _ := attempt(t, owner[ws[i]], ws[i]); ok {
			t.Fatalf("waiter %d got a permit before a waiter that came first", i)
		}
	}
	// Two permits free: the last comers try first and are refused.
	refused(4)
	refused(3)
	refused(2)
	grant(1)
	refused(4)
	grant(0)
	refused(2)
	// Waiter 2 leaves the line: 3 is next.
	if err := res[2].(backend.Withdrawer).Withdraw(t.Context(), ws[2]); err != nil {
		t.Fatal(err)
	}
	requests(4, "2 holders, 2 waiters")
	mustRelease(t, owner[ws[0]], ws[0])
	refused(4)
	grant(3)
	mustRelease(t, owner[ws[1]], ws[1])
	grant(4)
	mustRelease(t, owner[ws[3]], ws[3])
	mustRelease(t, owner[ws[4]], ws[4])
	wantRows(t, f, key)
}

// testSemaphoreHeadNotice: a release of a semaphore's permit with
// waiters in line notifies the first of them only, on the queue channel
// (as many as permits are free), not the key's waiters; a withdrawal of
// the waiter told tells the next one; with more permits free than
// waiters in line, the key's waiters are notified too (a newcomer may
// take one).
func testSemaphoreHeadNotice(t *testing.T, pg *pgFixture) {
	key := testsuite.Key(t)
	p := pg.resource(t, pg.pool(t, nil))
	listening(t, p)
	lease := func(waits bool) *backend.Lease {
		l := newLease(t, key, time.Minute)
		l.Kind, l.Limit, l.Waits = backend.KindSemaphore, 1, waits
		return l
	}
	holder := lease(false)
	mustAcquire(t, p, holder)
	ws := []*backend.Lease{lease(true), lease(true)}
	chs := make([]<-chan struct{}, len(ws))
	for i, w := range ws {
		if ok, _ := attempt(t, p, w); ok {
			t.Fatalf("waiter %d acquired a held permit", i)
		}
		ch, cancel := p.ln.subscribeWaiter(w.Value)
		t.Cleanup(cancel)
		chs[i] = ch
	}
	keyCh, cancel := p.Subscribe(key)
	t.Cleanup(cancel)
	quiet := func(ch <-chan struct{}, what string) {
		t.Helper()
		select {
		case <-ch:
			t.Fatalf("%s was notified", what)
		default:
		}
	}
	mustRelease(t, p, holder)
	noticed(t, chs[0], "the first waiter in line, after the release")
	noticeBarrier(t, p)
	quiet(chs[1], "the second waiter in line")
	quiet(keyCh, "the key's waiters, with a waiter in line for the only free permit")
	if err := p.Withdraw(t.Context(), ws[0]); err != nil {
		t.Fatal(err)
	}
	noticed(t, chs[1], "the next waiter in line, after the first withdrew")
	noticeBarrier(t, p)
	quiet(keyCh, "the key's waiters, after the withdrawal")
	if err := p.Withdraw(t.Context(), ws[1]); err != nil {
		t.Fatal(err)
	}
	wantRows(t, pg.fixture(), key)

	// Limit 2, one waiter in line: a release frees a permit for the
	// waiter and one for anybody.
	key2 := key + "-2"
	l2 := func(waits bool) *backend.Lease {
		l := newLease(t, key2, time.Minute)
		l.Kind, l.Limit, l.Waits = backend.KindSemaphore, 2, waits
		return l
	}
	h1, h2, w := l2(false), l2(false), l2(true)
	mustAcquire(t, p, h1)
	mustAcquire(t, p, h2)
	if ok, _ := attempt(t, p, w); ok {
		t.Fatal("the waiter acquired a held permit")
	}
	wch, wcancel := p.ln.subscribeWaiter(w.Value)
	t.Cleanup(wcancel)
	kch, kcancel := p.Subscribe(key2)
	t.Cleanup(kcancel)
	mustRelease(t, p, h1)
	noticed(t, wch, "the waiter in line")
	noticeBarrier(t, p)
	quiet(kch, "the key's waiters, with one permit free and one waiter in line")
	mustRelease(t, p, h2)
	noticed(t, kch, "the key's waiters, with two permits free and one waiter in line")
	if err := p.Withdraw(t.Context(), w); err != nil {
		t.Fatal(err)
	}
	wantRows(t, pg.fixture(), key2)
}
