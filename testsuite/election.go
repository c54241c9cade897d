package testsuite

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/distlock/distlock"
	"github.com/distlock/distlock/backend"
)

// testElection: the leader election of a name, on the store.
func testElection(t *testing.T, h *Harness) {
	t.Run("OneLeader", func(t *testing.T) { testElectionOneLeader(t, h) })
	t.Run("ResignHandsOver", func(t *testing.T) { testElectionResign(t, h) })
	t.Run("Proclaim", func(t *testing.T) { testElectionProclaim(t, h) })
	t.Run("LeaderLost", func(t *testing.T) { testElectionLost(t, h) })
	t.Run("Run", func(t *testing.T) { testElectionRun(t, h) })
	t.Run("BadInput", func(t *testing.T) { testElectionBadInput(t, h) })
	t.Run("WatchNotices", func(t *testing.T) { testElectionWatch(t, h) })
}

// testElectionWatch: a store that watches (backend.Watcher) sends a notice
// once its watch is set, and after each change of the election's mutex:
// a grant, a relabel, a release.
func testElectionWatch(t *testing.T, h *Harness) {
	w, ok := h.NewResource(t).(backend.Watcher)
	if !ok {
		t.Skip("the store does not implement backend.Watcher: observers use release notices and polls")
	}
	name := Key(t)
	ch, cancel := w.Watch(electionKey(name))
	defer cancel()
	if ch == nil {
		t.Fatal("Watch returned no channel")
	}
	next := func(what string) {
		t.Helper()
		select {
		case <-ch:
		case <-time.After(10 * time.Second):
			t.Fatalf("no notice within 10s of %s", what)
		}
	}
	drain := func() {
		for {
			select {
			case <-ch:
			case <-time.After(100 * time.Millisecond): // notices of the step before may trail
				return
			}
		}
	}
	next("the watch's start")
	drain()
	d := newLock(t, h)
	e := d.Election(name)
	lead := must(t)(e.Campaign(t.Context(), "v1"))
	next("a grant")
	drain()
	if _, ok := w.(backend.Relabeler); ok {
		if err := e.Proclaim(t.Context(), lead, "v2"); err != nil {
			t.Fatalf("Proclaim: %v", err)
		}
		next("a relabel")
		drain()
	}
	mustUnlock(t, lead)
	next("a release")
	noLeftovers(t, h, electionKey(name))
}

// electionKey is the key of the store's mutex for the election name.
func electionKey(name string) string { return backend.ElectionPrefix + name }

// observed collects what an Observe channel delivers.
type observed struct {
	mu   sync.Mutex
	seen []distlock.Leader
	done chan struct{}
}

func observe(t *testing.T, e *distlock.Election, ctx context.Context) *observed {
	t.Helper()
	ch, err := e.Observe(ctx)
	if err != nil {
		t.Fatalf("Observe: %v", err)
	}
	o := &observed{done: make(chan struct{})}
	go func() {
		defer close(o.done)
		for l := range ch {
			o.mu.Lock()
			o.seen = append(o.seen, l)
			o.mu.Unlock()
		}
	}()
	return o
}

func (o *observed) last() (distlock.Leader, bool) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if len(o.seen) == 0 {
		return distlock.Leader{}, false
	}
	return o.seen[len(o.seen)-1], true
}

// waitFor waits until the observer's last leader satisfies ok.
func (o *observed) waitFor(t *testing.T, what string, ok func(distlock.Leader) bool) {
	t.Helper()
	for end := time.Now().Add(15 * time.Second); ; time.Sleep(5 * time.Millisecond) {
		if l, seen := o.last(); seen && ok(l) {
			return
		}
		if time.Now().After(end) {
			l, _ := o.last()
			t.Fatalf("Observe did not deliver %s within 15s; last delivered %+v", what, l)
		}
	}
}

// checkOrder checks that the deliveries are changes in term order, each
// once: a larger term, or the same term with another value.
func (o *observed) checkOrder(t *testing.T, h *Harness) {
	t.Helper()
	o.mu.Lock()
	defer o.mu.Unlock()
	for i := 1; i < len(o.seen); i++ {
		a, b := o.seen[i-1], o.seen[i]
		switch {
		case a == b || a.Term == b.Term && a.Value == b.Value && a.Label == b.Label:
			t.Errorf("Observe delivered %+v twice (at %d)", b, i)
		case !h.NoToken && b.Term < a.Term:
			t.Errorf("Observe delivered term %d after term %d", b.Term, a.Term)
		}
	}
}

// testElectionOneLeader: 3 DistributeLocks x 2 candidates campaign, lead
// a few milliseconds, and resign, over and over: never two leaders at
// once, terms strictly increasing from leader to leader, and an observer
// delivering each change once, in term order, ending on the last leader.
func testElectionOneLeader(t *testing.T, h *Harness) {
	name := Key(t)
	ds := []*distlock.DistributeLock{newLock(t, h), newLock(t, h), newLock(t, h)}
	obs := observe(t, ds[0].Election(name), t.Context())
	var (
		mu      sync.Mutex
		leading atomic.Int32
		terms   []uint64
		n       atomic.Int64
	)
	ctx, stop := context.WithTimeout(t.Context(), 2*time.Second)
	defer stop()
	var wg sync.WaitGroup
	for i := range 6 {
		d := ds[i%3]
		wg.Go(func() {
			for ctx.Err() == nil {
				lead, err := d.Election(name).Campaign(ctx, fmt.Sprintf("c%d", i))
				if ctx.Err() != nil && errors.Is(err, distlock.ErrNotAcquired) {
					return
				}
				if err != nil {
					t.Errorf("candidate %d: Campaign: %v", i, err)
					return
				}
				if leading.Add(1) != 1 {
					t.Errorf("candidate %d elected while another leads", i)
				}
				mu.Lock()
				if k := len(terms); k > 0 && !h.NoToken && lead.Token() <= terms[k-1] {
					t.Errorf("term %d after term %d", lead.Token(), terms[k-1])
				}
				terms = append(terms, lead.Token())
				mu.Unlock()
				n.Add(1)
				time.Sleep(3 * time.Millisecond) // the leadership's work
				leading.Add(-1)
				mustUnlock(t, lead)
			}
		})
	}
	wg.Wait()
	// The last leader keeps its leadership: the observer must end on it.
	last := must(t)(ds[1].Election(name).Campaign(t.Context(), "c-last"))
	want := fmt.Sprint(last.Token())
	obs.waitFor(t, "the last leader (term "+want+")", func(l distlock.Leader) bool {
		return l.Value == "c-last" && l.Term == last.Token()
	})
	mustUnlock(t, last)
	obs.checkOrder(t, h)
	obs.mu.Lock()
	t.Logf("%d leaderships; the observer delivered %d leaders", n.Load(), len(obs.seen))
	obs.mu.Unlock()
	noLeftovers(t, h, electionKey(name))
}

// testElectionResign: a leader's resignation elects the waiting candidate
// at once: woken by the store (release notice or watch), not by its
// spin, which is a minute here (stores that send no notices wake it by
// their spin: WithSpin is then short).
func testElectionResign(t *testing.T, h *Harness) {
	name := Key(t)
	r := h.NewResource(t)
	spin := time.Minute
	if !notifies(r) {
		spin = 5 * time.Millisecond
		t.Logf("%T sends no release notices: the candidate spins", r)
	}
	a := newLock(t, h, distlock.WithLabel("a"))
	b := newLockOver(t, r, distlock.WithLabel("b"), distlock.WithSpin(spin, 0))
	lead := must(t)(a.Election(name).Campaign(t.Context(), "va"))
	elected := make(chan *distlock.Lock, 1)
	go func() {
		lb, err := b.Election(name).Campaign(t.Context(), "vb")
		if err != nil {
			t.Errorf("Campaign: %v", err)
		}
		elected <- lb
	}()
	if h.NoInspect == "" {
		got, err := b.Election(name).Leader(t.Context())
		if err != nil || got.Value != "va" || got.Label != "a" || (!h.NoToken && got.Term != lead.Token()) {
			t.Errorf("Leader() = %+v, %v; want va, a, term %d", got, err, lead.Token())
		}
	}
	time.Sleep(200 * time.Millisecond) // let b campaign (a slower b only checks less)
	select {
	case <-elected:
		t.Fatal("b elected while a leads")
	default:
	}
	start := time.Now()
	mustUnlock(t, lead)
	var lb *distlock.Lock
	select {
	case lb = <-elected:
	case <-time.After(10 * time.Second):
		t.Fatalf("b not elected within 10s of a's resignation (spin %v)", spin)
	}
	t.Logf("handover in %v", time.Since(start))
	if !h.NoToken && lb.Token() <= lead.Token() {
		t.Errorf("term %d after term %d; want larger", lb.Token(), lead.Token())
	}
	mustUnlock(t, lb)
	noLeftovers(t, h, electionKey(name))
}

// notifies reports whether r wakes waiters itself: a push store, or a
// pull store that sends release notices here.
func notifies(r backend.RemoteResource) bool {
	if _, ok := r.(backend.Waiter); ok {
		return true
	}
	if n, ok := r.(backend.Notifier); ok {
		ch, cancel := n.Subscribe("probe")
		cancel()
		return ch != nil
	}
	return false
}

// testElectionProclaim: Proclaim changes the published value and keeps
// the term; Leader and Observe see it; a store that cannot relabel says
// ErrUnsupported before any I/O.
func testElectionProclaim(t *testing.T, h *Harness) {
	name := Key(t)
	d := newLock(t, h, distlock.WithLabel("host:1"))
	e := d.Election(name)
	lead := must(t)(e.Campaign(t.Context(), "v1"))
	if _, ok := h.NewResource(t).(backend.Relabeler); !ok {
		if err := e.Proclaim(t.Context(), lead, "v2"); !errors.Is(err, distlock.ErrUnsupported) {
			t.Errorf("Proclaim on a store that cannot relabel = %v; want ErrUnsupported", err)
		}
		mustUnlock(t, lead)
		t.Skipf("the store cannot change a held lock's label: Proclaim is ErrUnsupported")
	}
	obs := observe(t, newLock(t, h).Election(name), t.Context())
	obs.waitFor(t, "v1", func(l distlock.Leader) bool { return l.Value == "v1" })
	if err := e.Proclaim(t.Context(), lead, "v2"); err != nil {
		t.Fatalf("Proclaim: %v", err)
	}
	got, err := e.Leader(t.Context())
	if err != nil || got.Value != "v2" || got.Label != "host:1" || (!h.NoToken && got.Term != lead.Token()) {
		t.Errorf("Leader() after Proclaim = %+v, %v; want v2, host:1, term %d", got, err, lead.Token())
	}
	obs.waitFor(t, "v2", func(l distlock.Leader) bool { return l.Value == "v2" })
	if l, _ := obs.last(); !h.NoToken && l.Term != lead.Token() {
		t.Errorf("observed term %d after Proclaim; want %d (the same leadership)", l.Term, lead.Token())
	}
	// A value as long as the label allows (252 bytes with it).
	long := strings.Repeat("x", 252-len("host:1"))
	if err := e.Proclaim(t.Context(), lead, long); err != nil {
		t.Errorf("Proclaim of %d bytes: %v", len(long), err)
	} else if got, err := e.Leader(t.Context()); err != nil || got.Value != long {
		t.Errorf("Leader() after a long Proclaim = %q, %v", got.Value, err)
	}
	obs.checkOrder(t, h)
	mustUnlock(t, lead)
	if err := e.Proclaim(t.Context(), lead, "v3"); !errors.Is(err, distlock.ErrNotHeld) {
		t.Errorf("Proclaim after resigning = %v; want ErrNotHeld", err)
	}
	noLeftovers(t, h, electionKey(name))
}

// testElectionLost: a leadership deleted behind the leader's back is lost
// (Done closes with renewal on), its Proclaim is ErrNotHeld, and the next
// candidate is elected.
func testElectionLost(t *testing.T, h *Harness) {
	name := Key(t)
	ttl := h.ttl()
	a := newLock(t, h, distlock.WithAutoRenew())
	b := newLock(t, h)
	ctx := distlock.ContextWithTTL(t.Context(), ttl)
	lead := must(t)(a.Election(name).Campaign(ctx, "a"))
	if err := h.Evict(t.Context(), electionKey(name)); err != nil {
		t.Fatalf("Evict: %v", err)
	}
	lb := must(t)(b.Election(name).Campaign(ctx, "b"))
	waitClosed(t, lead.Done(), 10*ttl+5*time.Second, "evicted leader")
	if _, ok := h.NewResource(t).(backend.Relabeler); ok {
		if err := a.Election(name).Proclaim(t.Context(), lead, "a2"); !errors.Is(err, distlock.ErrNotHeld) {
			t.Errorf("Proclaim of a lost leadership = %v; want ErrNotHeld", err)
		}
	}
	if h.NoInspect == "" {
		got, err := a.Election(name).Leader(t.Context())
		if err != nil || got.Value != "b" || (!h.NoToken && got.Term != lb.Token()) {
			t.Errorf("Leader() = %+v, %v; want b's", got, err)
		}
	}
	if err := lead.Unlock(t.Context()); !errors.Is(err, distlock.ErrNotHeld) {
		t.Errorf("resigning a lost leadership = %v; want ErrNotHeld", err)
	}
	mustUnlock(t, lb)
	noLeftovers(t, h, electionKey(name))
}

// testElectionRun: Run on two DistributeLocks: each runs its function once
// at a time; evicting the leader's mutex cancels its function's context (its
// renewal finds it gone) and the other is elected; every Run returns once
// its context ends, leaving nothing in the store.
func testElectionRun(t *testing.T, h *Harness) {
	name := Key(t)
	ttl := h.ttl()
	var (
		runs     atomic.Int32
		lostSeen atomic.Int32
		leaders  atomic.Int32
	)
	ctx, cancel := context.WithCancel(distlock.ContextWithTTL(t.Context(), ttl))
	var wg sync.WaitGroup
	for i := range 2 {
		d := newLock(t, h, distlock.WithAutoRenew())
		var running atomic.Int32
		wg.Go(func() {
			err := d.Election(name).Run(ctx, fmt.Sprintf("r%d", i), func(fctx context.Context, lead *distlock.Lock) error {
				if running.Add(1) != 1 {
					t.Errorf("runner %d: two functions run at once", i)
				}
				defer running.Add(-1)
				runs.Add(1)
				<-fctx.Done()
				if errors.Is(context.Cause(fctx), distlock.ErrNotHeld) {
					lostSeen.Add(1)
				}
				return nil
			}, distlock.WithRunBackoff(10*time.Millisecond, 100*time.Millisecond),
				distlock.OnNewLeader(func(distlock.Leader) { leaders.Add(1) }))
			if !errors.Is(err, context.Canceled) {
				t.Errorf("Run = %v; want context.Canceled", err)
			}
		})
	}
	waitUntil(t, "a leader to run", func() bool { return runs.Load() == 1 })
	for i := range 2 {
		if err := h.Evict(t.Context(), electionKey(name)); err != nil {
			t.Fatalf("Evict: %v", err)
		}
		// At least: the eviction may also take a waiting candidate's
		// znode just as the leader's deletion grants it (ZooKeeper hands
		// over on the predecessor's deletion event), and that leadership
		// is lost at once too.
		waitUntil(t, fmt.Sprintf("loss %d to cancel the function", i+1), func() bool { return lostSeen.Load() >= int32(i+1) })
		waitUntil(t, "the next leader to run", func() bool { return runs.Load() >= int32(i+2) })
	}
	if h.NoInspect == "" {
		waitUntil(t, "OnNewLeader to see a leader", func() bool { return leaders.Load() > 0 })
	}
	cancel()
	wg.Wait()
	noLeftovers(t, h, electionKey(name))
}

// waitUntil polls cond every 5ms for up to 30s.
func waitUntil(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for end := time.Now().Add(30 * time.Second); !cond(); time.Sleep(5 * time.Millisecond) {
		if time.Now().After(end) {
			t.Fatalf("timed out waiting for %s", what)
		}
	}
}

// testElectionBadInput: names the store cannot hold and values too long
// fail with ErrInvalid before any I/O; an election and a mutex of the
// same name are distinct locks.
func testElectionBadInput(t *testing.T, h *Harness) {
	r, c := wrapCounting(t, h.NewResource(t))
	d := newLockOver(t, r)
	ctx := t.Context()
	errs := map[string]error{
		"empty name":     func() error { _, err := d.Election("").Campaign(ctx, ""); return err }(),
		"value too long": func() error { _, err := d.Election("x").Campaign(ctx, strings.Repeat("v", 253)); return err }(),
		"mutex of an election's key": func() error {
			_, err := d.TryLock(ctx, electionKey("x"), 0)
			return err
		}(),
	}
	if h.MaxKeyLen > 0 {
		errs["name over the key limit"] = func() error {
			_, err := d.Election(strings.Repeat("n", h.MaxKeyLen)).Campaign(ctx, "")
			return err
		}()
	}
	for what, err := range errs {
		if !errors.Is(err, distlock.ErrInvalid) {
			t.Errorf("%s: %v; want ErrInvalid", what, err)
		}
	}
	wantNoCalls(t, c, "bad election input")
	// The election "k" and the mutex "k" do not exclude each other.
	name := Key(t)
	dl := newLock(t, h)
	lead := must(t)(dl.Election(name).Campaign(ctx, ""))
	mu := mustLock(t, dl, ctx, name, 0)
	mustUnlock(t, mu)
	mustUnlock(t, lead)
	noLeftovers(t, h, name)
	noLeftovers(t, h, electionKey(name))
}
