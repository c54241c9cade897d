package spin_test

import (
	"context"
	"testing"
	"time"

	"github.com/distlock/distlock/backend"
	"github.com/distlock/distlock/backend/memory"
	"github.com/distlock/distlock/internal/spin"
)

func release(t *testing.T, s *memory.Store, key string) {
	t.Helper()
	l := &backend.Lease{Key: key, Value: "v", TTL: time.Minute}
	if ok, _, err := s.TryAcquire(context.Background(), l); !ok || err != nil {
		t.Fatalf("TryAcquire = %v, %v", ok, err)
	}
	if err := s.Release(context.Background(), l); err != nil {
		t.Fatalf("Release = %v", err)
	}
}

func pending(ch <-chan struct{}) int {
	n := 0
	for {
		select {
		case <-ch:
			n++
		default:
			return n
		}
	}
}

// TestShareWakesOne: subscribers of one key share one channel, so a
// release notice is received once, not once per subscriber.
func TestShareWakesOne(t *testing.T) {
	store := memory.New()
	n := spin.Share(store)
	var chs []<-chan struct{}
	var cancels []func()
	for range 3 {
		ch, cancel := n.Subscribe("k")
		chs = append(chs, ch)
		cancels = append(cancels, cancel)
	}
	other, cancelOther := n.Subscribe("other")
	if chs[0] != chs[1] || chs[1] != chs[2] {
		t.Fatal("subscribers of one key got different channels")
	}
	if other == chs[0] {
		t.Fatal("subscribers of two keys share a channel")
	}
	release(t, store, "k")
	if got := pending(chs[0]); got != 1 {
		t.Errorf("one release gave %d notices on the shared channel; want 1", got)
	}
	if got := pending(other); got != 0 {
		t.Errorf("a release of k woke a subscriber of another key (%d)", got)
	}

	// The subscription lives until its last subscriber cancels.
	cancels[0]()
	cancels[0]() // a second call does nothing
	cancels[1]()
	release(t, store, "k")
	if got := pending(chs[2]); got != 1 {
		t.Errorf("with one subscriber left, a release gave %d notices; want 1", got)
	}
	cancels[2]()
	release(t, store, "k")
	if got := pending(chs[2]); got != 0 {
		t.Errorf("after the last cancel, a release still notified (%d)", got)
	}
	ch, cancel := n.Subscribe("k")
	defer cancel()
	if ch == chs[0] {
		t.Error("a subscription after the last cancel reused the old channel")
	}
	release(t, store, "k")
	if got := pending(ch); got != 1 {
		t.Errorf("a new subscription got %d notices; want 1", got)
	}
	cancelOther()
	if spin.Share(nil) != nil {
		t.Error("Share(nil) != nil")
	}
}
