package hotspot

import (
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/distlock/distlock"
	"github.com/distlock/distlock/backend/memory"
)

// fakeClock is a clock the test moves by hand.
type fakeClock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *fakeClock) now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *fakeClock) add(d time.Duration) {
	c.mu.Lock()
	c.t = c.t.Add(d)
	c.mu.Unlock()
}

func pollHot(t *testing.T, h *Handler, want []string) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		got := h.Hot()
		if slices.Equal(got, want) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("Hot() = %v; want %v", got, want)
		}
		time.Sleep(time.Millisecond)
	}
}

// crowd has n goroutines wait for key on d while another process holds it,
// until h promotes key; then lets them all through.
func crowd(t *testing.T, store *memory.Store, d *distlock.DistributeLock, h *Handler, key string, n int, wantHot []string) {
	t.Helper()
	other, err := distlock.New(store)
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()
	theirs, err := other.TryLock(t.Context(), key, 0)
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	for range n {
		wg.Go(func() {
			lk, err := d.TryLock(t.Context(), key, 10*time.Second)
			if err != nil {
				t.Error(err)
				return
			}
			if err := lk.Unlock(t.Context()); err != nil {
				t.Error(err)
			}
		})
	}
	pollHot(t, h, wantHot)
	if err := theirs.Unlock(t.Context()); err != nil {
		t.Fatal(err)
	}
	wg.Wait()
}

func TestAutoDetect(t *testing.T) {
	clock := &fakeClock{t: time.Now()}
	h, err := NewWithOptions(WithAutoDetect(2, 1), WithIdleAfter(time.Minute), WithKeys("static"))
	if err != nil {
		t.Fatal(err)
	}
	h.now = clock.now
	store := memory.New()
	d, err := distlock.New(store, distlock.WithHandlers(h))
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()

	// One waiter at a time never promotes a key.
	for range 3 {
		lk, err := d.TryLock(t.Context(), "calm", 0)
		if err != nil {
			t.Fatal(err)
		}
		lk.Unlock(t.Context())
	}
	if got := h.Hot(); !slices.Equal(got, []string{"static"}) {
		t.Fatalf("Hot() = %v; want [static]: one goroutine at a time is not a crowd", got)
	}

	// Two waiters at once promote it.
	crowd(t, store, d, h, "a", 3, []string{"a", "static"})
	// Capacity 1: promoting b demotes a, the least recently used.
	crowd(t, store, d, h, "b", 3, []string{"b", "static"})

	h.mu.Lock()
	entries, waiting := len(h.entries), len(h.waiting)
	h.mu.Unlock()
	if entries != 2 || waiting != 0 {
		t.Errorf("%d entries, %d waiting counters after the crowds; want 2, 0 (memory stays bounded)", entries, waiting)
	}

	// Idle promoted keys are demoted; registered ones stay.
	clock.add(59 * time.Second)
	if got := h.Hot(); !slices.Equal(got, []string{"b", "static"}) {
		t.Errorf("Hot() before the idle time = %v; want [b static]", got)
	}
	clock.add(time.Second)
	if got := h.Hot(); !slices.Equal(got, []string{"static"}) {
		t.Errorf("Hot() after the idle time = %v; want [static]", got)
	}
	h.mu.Lock()
	entries = len(h.entries)
	h.mu.Unlock()
	if entries != 1 {
		t.Errorf("%d entries after demotion; want 1", entries)
	}
}

// TestAutoDetectEvictsBusyKey demotes a key whose local lock is held; its
// holder keeps working and releases it normally.
func TestAutoDetectEvictsBusyKey(t *testing.T) {
	h, err := NewWithOptions(WithAutoDetect(1, 1))
	if err != nil {
		t.Fatal(err)
	}
	d, err := distlock.New(memory.New(), distlock.WithHandlers(h))
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	a, err := d.TryLock(t.Context(), "a", 0) // threshold 1: promoted at once
	if err != nil {
		t.Fatal(err)
	}
	b, err := d.TryLock(t.Context(), "b", 0) // evicts a while held
	if err != nil {
		t.Fatal(err)
	}
	if got := h.Hot(); !slices.Equal(got, []string{"b"}) {
		t.Errorf("Hot() = %v; want [b]", got)
	}
	// a's holder still holds a's local lock; promoting a again reuses it.
	if _, err := d.TryLock(t.Context(), "a", 0); err == nil {
		t.Fatal("second TryLock of a held key succeeded")
	}
	if err := a.Unlock(t.Context()); err != nil {
		t.Fatal(err)
	}
	if err := b.Unlock(t.Context()); err != nil {
		t.Fatal(err)
	}
	a, err = d.TryLock(t.Context(), "a", 0)
	if err != nil {
		t.Fatalf("TryLock(a) after Unlock = %v", err)
	}
	a.Unlock(t.Context())
}

// countingNotifier counts live subscriptions of a memory store.
type countingNotifier struct {
	*memory.Store
	mu   sync.Mutex
	live int
}

func (c *countingNotifier) Subscribe(key string) (<-chan struct{}, func()) {
	ch, cancel := c.Store.Subscribe(key)
	c.mu.Lock()
	c.live++
	c.mu.Unlock()
	return ch, func() {
		cancel()
		c.mu.Lock()
		c.live--
		c.mu.Unlock()
	}
}

func (c *countingNotifier) subscriptions() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.live
}

// TestStandingSubscription: one subscription per key while it is in use,
// none after.
func TestStandingSubscription(t *testing.T) {
	n := &countingNotifier{Store: memory.New()}
	h, err := NewWithOptions(WithKeys("k"), WithNotifier(n))
	if err != nil {
		t.Fatal(err)
	}
	d, err := distlock.New(n.Store, distlock.WithHandlers(h))
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	lk, err := d.TryLock(t.Context(), "k", 0)
	if err != nil {
		t.Fatal(err)
	}
	if got := n.subscriptions(); got != 1 {
		t.Errorf("%d subscriptions while k is held; want 1", got)
	}
	if _, err := d.TryLock(t.Context(), "k", 0); err == nil {
		t.Fatal("second TryLock succeeded")
	}
	if got := n.subscriptions(); got != 1 {
		t.Errorf("%d subscriptions after a failed local attempt; want 1", got)
	}
	if err := lk.Unlock(t.Context()); err != nil {
		t.Fatal(err)
	}
	if got := n.subscriptions(); got != 0 {
		t.Errorf("%d subscriptions after k is free; want 0", got)
	}
}
