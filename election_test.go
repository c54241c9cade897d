package distlock_test

import (
	"context"
	"errors"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/distlock/distlock"
	"github.com/distlock/distlock/backend"
	"github.com/distlock/distlock/backend/memory"
)

// TestElectionHandover: one leader at a time, terms increasing, Leader
// reading the value and label, resign electing the next at once.
func TestElectionHandover(t *testing.T) {
	store := memory.New()
	a := newLock(t, store, distlock.WithLabel("a"))
	b := newLock(t, store, distlock.WithLabel("b"), distlock.WithSpin(time.Hour, 0)) // only the release notice can wake b
	ctx := t.Context()
	la, err := a.Election("jobs").Campaign(ctx, "http://a:8080")
	if err != nil {
		t.Fatal(err)
	}
	if got := la.Key(); got != backend.ElectionPrefix+"jobs" {
		t.Errorf("Key() = %q; want %q", got, backend.ElectionPrefix+"jobs")
	}
	got, err := b.Election("jobs").Leader(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if got.Value != "http://a:8080" || got.Label != "a" || got.Term != la.Token() || got.TTL <= 0 {
		t.Errorf("Leader() = %+v; want value http://a:8080, label a, term %d, a TTL", got, la.Token())
	}
	elected := make(chan *distlock.Lock, 1)
	go func() {
		lb, err := b.Election("jobs").Campaign(ctx, "http://b:8080")
		if err != nil {
			t.Error(err)
		}
		elected <- lb
	}()
	select {
	case <-elected:
		t.Fatal("b elected while a leads")
	case <-time.After(50 * time.Millisecond): // an absence: nothing to wait for
	}
	if err := la.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	var lb *distlock.Lock
	select {
	case lb = <-elected:
	case <-time.After(10 * time.Second):
		t.Fatal("b not elected after a resigned (the release notice should wake it)")
	}
	if lb.Token() <= la.Token() {
		t.Errorf("term %d after term %d; want it larger", lb.Token(), la.Token())
	}
	got, err = a.Election("jobs").Leader(ctx)
	if err != nil || got.Value != "http://b:8080" || got.Label != "b" || got.Term != lb.Token() {
		t.Errorf("Leader() = %+v, %v; want b's", got, err)
	}
	if err := lb.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := a.Election("jobs").Leader(ctx); !errors.Is(err, distlock.ErrNoLeader) {
		t.Errorf("Leader() of a vacant election = %v; want ErrNoLeader", err)
	}
}

// TestElectionProclaim: the value changes, the term stays; a lost
// leadership's Proclaim is ErrNotHeld and closes Done.
func TestElectionProclaim(t *testing.T) {
	store := memory.New()
	d := newLock(t, store, distlock.WithLabel("host:1"))
	e := d.Election("p")
	ctx := t.Context()
	lead, err := e.Campaign(ctx, "v1")
	if err != nil {
		t.Fatal(err)
	}
	if err := e.Proclaim(ctx, lead, "v2"); err != nil {
		t.Fatal(err)
	}
	got, err := e.Leader(ctx)
	if err != nil || got.Value != "v2" || got.Label != "host:1" || got.Term != lead.Token() {
		t.Errorf("Leader() after Proclaim = %+v, %v; want v2, host:1, term %d", got, err, lead.Token())
	}
	store.Evict(backend.ElectionPrefix + "p")
	if err := e.Proclaim(ctx, lead, "v3"); !errors.Is(err, distlock.ErrNotHeld) {
		t.Errorf("Proclaim of an evicted leadership = %v; want ErrNotHeld", err)
	}
	select {
	case <-lead.Done():
	default:
		t.Error("Done open after Proclaim found the leadership gone")
	}
}

// TestElectionBadInput: bad names, values, leads and options fail with
// ErrInvalid before any I/O; mutex keys of elections are refused.
func TestElectionBadInput(t *testing.T) {
	store := memory.New()
	d := newLock(t, store, distlock.WithLabel(strings.Repeat("l", 200)))
	ctx := t.Context()
	other, err := d.Election("other").Campaign(ctx, "")
	if err != nil {
		t.Fatal(err)
	}
	defer other.Unlock(ctx)
	mutex, err := d.TryLock(ctx, "m", 0)
	if err != nil {
		t.Fatal(err)
	}
	defer mutex.Unlock(ctx)
	e := d.Election("e")
	var nilCtx context.Context
	fn := func(context.Context, *distlock.Lock) error { return nil }
	cases := []struct {
		name string
		err  error
	}{
		{"empty name", func() error { _, err := d.Election("").Campaign(ctx, ""); return err }()},
		{"nil ctx", func() error { _, err := e.Campaign(nilCtx, ""); return err }()},
		{"value too long", func() error { _, err := e.Campaign(ctx, strings.Repeat("v", 53)); return err }()},
		{"proclaim of another election's lead", e.Proclaim(ctx, other, "x")},
		{"proclaim of a mutex", e.Proclaim(ctx, mutex, "x")},
		{"proclaim of nil", e.Proclaim(ctx, nil, "x")},
		{"proclaim too long", d.Election("other").Proclaim(ctx, other, strings.Repeat("v", 53))},
		{"leader of empty name", func() error { _, err := d.Election("").Leader(ctx); return err }()},
		{"observe nil ctx", func() error { _, err := e.Observe(nilCtx); return err }()},
		{"run nil fn", e.Run(ctx, "", nil)},
		{"run bad backoff", e.Run(ctx, "", fn, distlock.WithRunBackoff(0, time.Second))},
		{"run nil option", e.Run(ctx, "", fn, nil)},
		{"mutex of an election's key", func() error { _, err := d.TryLock(ctx, backend.ElectionPrefix+"e", 0); return err }()},
		{"set with an election's key", func() error {
			_, err := d.TryLockAll(ctx, []string{"a", backend.ElectionPrefix + "e"}, 0)
			return err
		}()},
		{"inspect an election's key", func() error { _, err := d.Inspect(ctx, backend.ElectionPrefix+"e"); return err }()},
	}
	for _, c := range cases {
		if !errors.Is(c.err, distlock.ErrInvalid) {
			t.Errorf("%s: %v; want ErrInvalid", c.name, c.err)
		}
	}
	if n := store.Len(); n != 2 {
		t.Errorf("the store holds %d grants; want the 2 of the test (bad input touched it)", n)
	}
	if _, err := e.Campaign(ctx, strings.Repeat("v", 52)); err != nil {
		t.Errorf("Campaign with 252 bytes of label and value = %v; want it elected", err)
	}
}

// TestElectionObserve: the current leader first, then each change in term
// order, once; a vacancy is not delivered; the channel closes with ctx.
func TestElectionObserve(t *testing.T) {
	store := memory.New()
	d := newLock(t, store)
	e := d.Election("o")
	ctx, cancel := context.WithCancel(t.Context())
	lead, err := e.Campaign(ctx, "first")
	if err != nil {
		t.Fatal(err)
	}
	ch, err := e.Observe(ctx)
	if err != nil {
		t.Fatal(err)
	}
	next := func(want string) distlock.Leader {
		t.Helper()
		select {
		case l := <-ch:
			if l.Value != want {
				t.Fatalf("observed %+v; want value %q", l, want)
			}
			return l
		case <-time.After(10 * time.Second):
			t.Fatalf("nothing observed; want %q", want)
		}
		return distlock.Leader{}
	}
	l1 := next("first")
	if err := e.Proclaim(ctx, lead, "second"); err != nil {
		t.Fatal(err)
	}
	if l2 := next("second"); l2.Term != l1.Term {
		t.Errorf("term %d after Proclaim; want %d", l2.Term, l1.Term)
	}
	if err := lead.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	lead, err = e.Campaign(ctx, "third")
	if err != nil {
		t.Fatal(err)
	}
	if l3 := next("third"); l3.Term <= l1.Term {
		t.Errorf("term %d after term %d; want larger", l3.Term, l1.Term)
	}
	cancel()
	for range ch { // closes once ctx ended
	}
	_ = lead.Unlock(t.Context())
}

// TestElectionObserveSlowReader: a reader that does not read holds up
// nothing, and then gets the current leader, not the ones it missed.
func TestElectionObserveSlowReader(t *testing.T) {
	store := memory.New()
	d := newLock(t, store)
	e := d.Election("slow")
	ctx := t.Context()
	ch, err := e.Observe(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var last *distlock.Lock
	for i := range 20 {
		lead, err := e.Campaign(ctx, "v")
		if err != nil {
			t.Fatal(err)
		}
		if i < 19 {
			if err := lead.Unlock(ctx); err != nil {
				t.Fatal(err)
			}
		}
		last = lead
	}
	deadline := time.After(10 * time.Second)
	for {
		select {
		case l := <-ch:
			if l.Term == last.Token() {
				return
			}
			if l.Term > last.Token() {
				t.Fatalf("observed term %d beyond the last %d", l.Term, last.Token())
			}
		case <-deadline:
			t.Fatalf("the slow reader never got the current leader (term %d)", last.Token())
		}
	}
}

// TestElectionHandlersSeeKind: handlers see a campaign as an acquisition
// of kind KindElection of the election's key.
func TestElectionHandlersSeeKind(t *testing.T) {
	h := &kindRecorder{}
	d := newLock(t, memory.New(), distlock.WithHandlers(h))
	lead, err := d.Election("k").Campaign(t.Context(), "v")
	if err != nil {
		t.Fatal(err)
	}
	if err := lead.Unlock(t.Context()); err != nil {
		t.Fatal(err)
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	want := []string{"acquire election " + backend.ElectionPrefix + "k", "release election " + backend.ElectionPrefix + "k"}
	if strings.Join(h.seen, "|") != strings.Join(want, "|") {
		t.Errorf("handler saw %q; want %q", h.seen, want)
	}
}

type kindRecorder struct {
	mu   sync.Mutex
	seen []string
}

func (k *kindRecorder) Acquire(ctx context.Context, r *distlock.Request, next distlock.AcquireFunc) error {
	k.mu.Lock()
	k.seen = append(k.seen, "acquire "+r.Kind.String()+" "+r.Key)
	k.mu.Unlock()
	return next(ctx, r)
}

func (k *kindRecorder) Release(ctx context.Context, r *distlock.Request, next distlock.ReleaseFunc) error {
	k.mu.Lock()
	k.seen = append(k.seen, "release "+r.Kind.String()+" "+r.Key)
	k.mu.Unlock()
	return next(ctx, r)
}

// relabelSpy wraps the memory store and checks that a Relabel never
// overlaps a Refresh of the same lease, and that the renewals after a
// Relabel carry its label (a store that writes the label with a renewal,
// as ZooKeeper does, would otherwise put the old one back).
type relabelSpy struct {
	*memory.Store
	inRelabel, inRefresh atomic.Int32
	overlaps             atomic.Int32
	mu                   sync.Mutex
	labels               []string // the label of each Refresh
	relabelDelay         time.Duration
}

func (s *relabelSpy) Refresh(ctx context.Context, l *backend.Lease) error {
	s.inRefresh.Add(1)
	defer s.inRefresh.Add(-1)
	if s.inRelabel.Load() != 0 {
		s.overlaps.Add(1)
	}
	s.mu.Lock()
	s.labels = append(s.labels, l.Label)
	s.mu.Unlock()
	time.Sleep(time.Millisecond) // a round trip during which a Relabel could start
	return s.Store.Refresh(ctx, l)
}

func (s *relabelSpy) Relabel(ctx context.Context, l *backend.Lease) error {
	s.inRelabel.Add(1)
	defer s.inRelabel.Add(-1)
	if s.inRefresh.Load() != 0 {
		s.overlaps.Add(1)
	}
	time.Sleep(s.relabelDelay) // longer than a renewal interval: the renewal due meanwhile waits
	return s.Store.Relabel(ctx, l)
}

// TestProclaimOneAtATimeWithRenewals: a Proclaim waits for a renewal in
// flight and holds the next one back; renewals then carry the new label;
// the renewal that was due runs once the Proclaim is over.
func TestProclaimOneAtATimeWithRenewals(t *testing.T) {
	spy := &relabelSpy{Store: memory.New(), relabelDelay: 120 * time.Millisecond}
	d, err := distlock.New(spy, distlock.WithAutoRenew(), distlock.WithDefaultTTL(300*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	e := d.Election("r")
	ctx := t.Context()
	lead, err := e.Campaign(ctx, "old")
	if err != nil {
		t.Fatal(err)
	}
	for i := range 5 {
		if err := e.Proclaim(ctx, lead, "new"+string(rune('0'+i))); err != nil {
			t.Fatalf("Proclaim %d: %v", i, err)
		}
	}
	spy.mu.Lock()
	n := len(spy.labels)
	spy.mu.Unlock()
	// Renewals go on after the Proclaims (every 100ms): wait for two.
	for end := time.Now().Add(10 * time.Second); ; time.Sleep(5 * time.Millisecond) {
		spy.mu.Lock()
		m := len(spy.labels)
		spy.mu.Unlock()
		if m >= n+2 {
			break
		}
		if time.Now().After(end) {
			t.Fatal("no renewal after the Proclaims")
		}
	}
	select {
	case <-lead.Done():
		t.Fatalf("leadership lost across Proclaims: %v", context.Cause(ctx))
	default:
	}
	if n := spy.overlaps.Load(); n != 0 {
		t.Errorf("%d Relabel calls overlapped a Refresh of the lease; want 0", n)
	}
	spy.mu.Lock()
	last := spy.labels[len(spy.labels)-1]
	spy.mu.Unlock()
	if _, value, _ := strings.Cut(last, ":"); value != "new4" {
		t.Errorf("the last renewal carried label %q; want the last Proclaim's (value new4)", last)
	}
	got, err := e.Leader(ctx)
	if err != nil || got.Value != "new4" {
		t.Errorf("Leader() = %+v, %v; want new4", got, err)
	}
}

// relabelReleaseRace wraps the memory store: its (one) Relabel waits
// until a Release has begun, and that first Release fails (a store error)
// once the test says so; the labels of the Refresh calls are kept.
type relabelReleaseRace struct {
	*memory.Store
	relabeling, releasing, failRelease chan struct{}
	mu                                 sync.Mutex
	labels                             []string
	failed                             atomic.Bool
}

func (s *relabelReleaseRace) Relabel(ctx context.Context, l *backend.Lease) error {
	close(s.relabeling)
	<-s.releasing
	return s.Store.Relabel(ctx, l)
}

func (s *relabelReleaseRace) Release(ctx context.Context, l *backend.Lease) error {
	if s.failed.CompareAndSwap(false, true) {
		close(s.releasing)
		<-s.failRelease
		return errors.New("injected: the store failed")
	}
	return s.Store.Release(ctx, l)
}

func (s *relabelReleaseRace) Refresh(ctx context.Context, l *backend.Lease) error {
	s.mu.Lock()
	s.labels = append(s.labels, l.Label)
	s.mu.Unlock()
	return s.Store.Refresh(ctx, l)
}

// TestProclaimDuringFailedResign: a Proclaim that succeeds while the
// leadership is being resigned, when the resignation then fails, leaves
// the new value the lease's: a later Extend carries it (a store that
// writes the label with a refresh, as ZooKeeper does, would otherwise put
// the old value back).
func TestProclaimDuringFailedResign(t *testing.T) {
	spy := &relabelReleaseRace{Store: memory.New(), relabeling: make(chan struct{}),
		releasing: make(chan struct{}), failRelease: make(chan struct{})}
	d, err := distlock.New(spy)
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	e := d.Election("r")
	ctx := t.Context()
	lead, err := e.Campaign(ctx, "old")
	if err != nil {
		t.Fatal(err)
	}
	proclaimed := make(chan error, 1)
	go func() { proclaimed <- e.Proclaim(ctx, lead, "new") }()
	<-spy.relabeling // the Proclaim is in flight: the resignation begins
	unlocked := make(chan error, 1)
	go func() { unlocked <- lead.Unlock(ctx) }()
	if err := <-proclaimed; err != nil {
		t.Fatalf("Proclaim: %v; want nil (the store relabelled)", err)
	}
	close(spy.failRelease)
	if err := <-unlocked; err == nil {
		t.Fatal("Unlock: nil; want the injected store error")
	}
	if err := lead.Extend(ctx, time.Minute); err != nil {
		t.Fatalf("Extend after the failed resignation: %v", err)
	}
	spy.mu.Lock()
	labels := spy.labels
	spy.mu.Unlock()
	if len(labels) == 0 {
		t.Fatal("Extend sent no Refresh")
	}
	if _, value, _ := strings.Cut(labels[len(labels)-1], ":"); value != "new" {
		t.Errorf("the Extend carried label %q; want the Proclaim's (value new)", labels[len(labels)-1])
	}
	if err := lead.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
}

// hangingRelabel wraps the memory store: its Relabel signals that it
// began and then hangs until its context ends (a store that does not
// answer).
type hangingRelabel struct {
	*memory.Store
	began chan struct{}
	once  sync.Once
}

func (s *hangingRelabel) Relabel(ctx context.Context, l *backend.Lease) error {
	s.once.Do(func() { close(s.began) })
	<-ctx.Done()
	return ctx.Err()
}

// TestProclaimWaitingForRenewalEndsOnLoss: a Proclaim that waits for a
// due renewal to go first returns ErrNotHeld when the leadership is lost
// instead (no renewal goes then), even with a context that never ends.
// Here a first Proclaim hangs until the validity ends, the renewal it held
// back is due, and the scheduler finds the validity ended.
func TestProclaimWaitingForRenewalEndsOnLoss(t *testing.T) {
	store := &hangingRelabel{Store: memory.New(), began: make(chan struct{})}
	d, err := distlock.New(store, distlock.WithAutoRenew(), distlock.WithDefaultTTL(300*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	e := d.Election("r")
	lead, err := e.Campaign(t.Context(), "old")
	if err != nil {
		t.Fatal(err)
	}
	first := make(chan error, 1)
	go func() { first <- e.Proclaim(context.Background(), lead, "a") }()
	<-store.began
	second := make(chan error, 1)
	go func() { second <- e.Proclaim(context.Background(), lead, "b") }()
	for i, ch := range []chan error{first, second} {
		select {
		case err := <-ch:
			if i == 1 && !errors.Is(err, distlock.ErrNotHeld) {
				t.Errorf("the second Proclaim = %v; want ErrNotHeld (the leadership was lost)", err)
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("Proclaim %d still waiting 10s after the leadership's validity ended", i+1)
		}
	}
	select {
	case <-lead.Done():
	default:
		t.Error("Done open after the leadership's validity ended")
	}
}
