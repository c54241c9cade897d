package etcd

import (
	"context"
	"strings"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/distlock/distlock/backend"
	"github.com/distlock/distlock/internal/testserver"
)

// lateCatchUp is a clientv3.Watcher that injects, exaggerated, the delay
// etcd gives a watch starting at a revision already written: the server
// serves such a watch as unsynced, from a catch-up loop that runs every
// 100 ms, instead of sending each event as it happens. Before each queue
// watch it writes a key elsewhere, as contention does between a waiter's
// read and its watch, so that a watch from "the revision after my read"
// is always in the past; it then holds such a watch's events back for a
// minute. A watch from now on is passed through untouched.
type lateCatchUp struct {
	clientv3.Watcher
	c      *clientv3.Client
	queues string // the queue directories' common prefix
	noise  string // the key written before each queue watch
}

func (w *lateCatchUp) Watch(ctx context.Context, key string, opts ...clientv3.OpOption) clientv3.WatchChan {
	if !strings.HasPrefix(key, w.queues) || key == w.queues {
		return w.Watcher.Watch(ctx, key, opts...) // the Resource's own deletion watch
	}
	if _, err := w.c.Put(ctx, w.noise, "x"); err != nil {
		panic(err) // the test's server is local; its Put does not fail
	}
	in := w.Watcher.Watch(ctx, key, opts...)
	if clientv3.OpGet(key, opts...).Rev() == 0 {
		return in
	}
	out := make(chan clientv3.WatchResponse)
	go func() {
		defer close(out)
		select {
		case <-time.After(time.Minute):
		case <-ctx.Done():
			return
		}
		for wr := range in {
			select {
			case out <- wr:
			case <-ctx.Done():
				return
			}
		}
	}()
	return out
}

// TestWokenByRelease: a waiter is granted on the release that admits it,
// even when keys were written between its read of the queue and the
// making of its watch (what contention always gives): it does not depend
// on the server's catch-up of a watch that starts in the past, which etcd
// runs every 100 ms (here, held back for a minute). A semaphore waiter,
// a writer behind a reader and a reader behind a writer, each on both
// kinds of lease.
func TestWokenByRelease(t *testing.T) {
	endpoints := testserver.Etcd(t).Endpoints
	for _, m := range modes {
		for _, c := range []struct {
			name         string
			holder, wait backend.Kind
			limit        int
		}{
			{"Semaphore", backend.KindSemaphore, backend.KindSemaphore, 2},
			{"WriterBehindReader", backend.KindRead, backend.KindWrite, 0},
			{"ReaderBehindWriter", backend.KindWrite, backend.KindRead, 0},
			{"Mutex", backend.KindMutex, backend.KindMutex, 0},
		} {
			t.Run(m.name+"/"+c.name, func(t *testing.T) {
				ctx := t.Context()
				key := uniqueKey(t)
				a := newResource(t, endpoints, m.opts...)
				wc := newClient(t, endpoints)
				w := mustNew(t, wc, m.opts...)
				wc.Watcher = &lateCatchUp{Watcher: wc.Watcher, c: wc, queues: w.prefix, noise: "/noise/" + key}
				t.Cleanup(func() {
					if err := w.Close(); err != nil {
						t.Errorf("Close: %v", err)
					}
				})
				holders := max(c.limit, 1)
				var held []*backend.Lease
				for range holders {
					l := kindLease(key, c.holder, c.limit, 10*time.Second)
					if err := a.Acquire(ctx, l, time.Time{}); err != nil {
						t.Fatal(err)
					}
					held = append(held, l)
				}
				l := kindLease(key, c.wait, c.limit, 10*time.Second)
				errc := acquireAsync(ctx, w, l, time.Minute)
				waitKeys(t, a, key, holders+1)
				waiting(t, "the waiter", errc)
				if err := a.Release(ctx, held[0]); err != nil {
					t.Fatal(err)
				}
				granted(t, "the waiter, after the release", errc)
				if l.Token <= held[len(held)-1].Token {
					t.Errorf("waiter's token %d, not above the holders' (%d)", l.Token, held[len(held)-1].Token)
				}
				if err := w.Release(ctx, l); err != nil {
					t.Fatal(err)
				}
				for _, h := range held[1:] {
					if err := a.Release(ctx, h); err != nil {
						t.Fatal(err)
					}
				}
				waitKeys(t, a, key, 0)
			})
		}
	}
}
