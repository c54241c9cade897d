package etcd

import (
	"context"
	"errors"
	"sync"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/distlock/distlock/backend"
)

// keyWatch is the Resource's one watch on its prefix, for deletions only:
// it tells a lock that its key is gone (its lease revoked or expired, the
// key deleted by an operator or a tool) by closing the lock's Lost
// channel; for a lock on a shared lease, it also closes Lost when the
// lease is lost (sessionLost). One watch serves every such lock of the
// Resource: a lock costs a map entry, not a watch of its own (whose
// creation would cost a round trip, one at a time on the client's watch
// stream). The price is that the Resource hears of every deletion under
// its prefix, other processes' releases included.
//
// A key is registered before the transaction that makes it, and the watch
// is created before the first registration returns, so every deletion of
// the key comes through the watch: none can fall between the key's
// creation and the watch's. The watch resumes after the last event seen
// when it breaks; only when etcd compacted past that point does it start
// afresh, and then reads every registered key once.
type keyWatch struct {
	mu      sync.Mutex
	started bool
	ready   chan struct{} // closed once the watch is first created, or stopped
	err     error         // why the watch stopped (Close, client closed)
	keys    map[string]*handle
}

var errWatchStopped = errors.New("key watch stopped")

// watchKey registers h, whose key does not exist yet, for the loss
// signal, starting the Resource's watch if it is not running. It returns
// when the watch is created, or ctx's error.
func (r *Resource) watchKey(ctx context.Context, h *handle) error {
	w := &r.watch
	w.mu.Lock()
	if !w.started {
		w.started = true
		w.ready = make(chan struct{})
		w.keys = make(map[string]*handle)
		if !r.background(r.runWatch) {
			w.err = errors.New("resource closed")
			close(w.ready)
		}
	}
	ready := w.ready
	w.mu.Unlock()
	select {
	case <-ready:
	case <-ctx.Done():
		return ctx.Err()
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.err != nil {
		return w.err
	}
	h.wrev, h.wdel, h.wcheck, h.wrel = 0, 0, false, false
	w.keys[h.key] = h
	return nil
}

// keyMade tells the watch h's create revision. It reports whether the key
// is still there as far as the watch knows.
func (r *Resource) keyMade(h *handle, rev int64) bool {
	w := &r.watch
	w.mu.Lock()
	if w.keys[h.key] != h {
		w.mu.Unlock()
		return false
	}
	h.wrev = rev
	if h.wdel > rev {
		r.lostLocked(h)
		w.mu.Unlock()
		return false
	}
	check := h.wcheck
	w.mu.Unlock()
	if check { // the watch started afresh while the key was being made
		r.background(func(ctx context.Context) { r.checkKey(ctx, h, rev) })
	}
	return true
}

// releasing tells the watch that h's own release is deleting its key
// (on), or that the release failed and the lock may still be held (off):
// the deletion by the release itself is no loss.
func (r *Resource) releasing(h *handle, on bool) {
	w := &r.watch
	w.mu.Lock()
	defer w.mu.Unlock()
	h.wrel = on
	if !on && w.keys[h.key] == h && h.wdel > h.wrev {
		r.lostLocked(h)
	}
}

// unwatchKey forgets h: it was released or its acquisition failed.
func (r *Resource) unwatchKey(h *handle) {
	w := &r.watch
	w.mu.Lock()
	if w.keys[h.key] == h {
		delete(w.keys, h.key)
	}
	w.mu.Unlock()
}

// deleted is called for every deletion under the prefix.
func (r *Resource) deleted(key string, rev int64) {
	w := &r.watch
	w.mu.Lock()
	defer w.mu.Unlock()
	h := w.keys[key]
	switch {
	case h == nil:
	case h.fired.Load() && h.wrev != 0 && rev > h.wrev: // its lease was lost; now the key is gone
		delete(w.keys, h.key)
		r.free(h)
	case h.wrev == 0 || h.wrel: // being made (an older key of the name, or ours), or released
		h.wdel = max(h.wdel, rev)
	case rev > h.wrev:
		r.lostLocked(h)
	}
}

// lostLocked closes h's Lost and forgets h; the key is known gone, so its
// name is free again. w.mu is held.
func (r *Resource) lostLocked(h *handle) {
	delete(r.watch.keys, h.key)
	closeLost(h)
	r.free(h)
}

// closeLost fires h's Lost unless it fired already. The watch's mutex is
// held: only holders of it fire Lost.
func closeLost(h *handle) {
	if h.fired.Load() {
		return
	}
	lostMu.Lock()
	h.fired.Store(true)
	if h.lost != nil {
		close(h.lost)
	}
	lostMu.Unlock()
}

// lostMu guards the lost channel of every handle: made by the first Done
// call, which only a waiter makes (Lock.Done asked for, loss observers,
// a wait in the queue), so that a held lock nobody waits on costs no
// channel; both Done and a loss are rare, and the mutex is held for no
// more than a make or a close.
var lostMu sync.Mutex

var _ backend.LossSignal = (*handle)(nil)

// Done returns the channel closed when h's Lost fires, making it.
func (h *handle) Done() <-chan struct{} {
	lostMu.Lock()
	defer lostMu.Unlock()
	if h.lost == nil {
		h.lost = make(chan struct{})
		if h.fired.Load() {
			close(h.lost)
		}
	}
	return h.lost
}

// Closed reports whether h's Lost fired.
func (h *handle) Closed() bool { return h.fired.Load() }

// sessionLost closes the Lost of every lock registered on s, whose lease
// is lost. The locks stay registered until their key is seen deleted (the
// lease expires), released or forgotten, so that their names are not used
// again before.
func (r *Resource) sessionLost(s *session) {
	w := &r.watch
	w.mu.Lock()
	defer w.mu.Unlock()
	for _, h := range w.keys {
		if h.sess == s {
			closeLost(h)
		}
	}
}

// checkKey reads h's key once and reports the loss if it is gone.
func (r *Resource) checkKey(ctx context.Context, h *handle, rev int64) {
	for {
		resp, err := r.c.Get(ctx, h.key, clientv3.WithKeysOnly())
		if err == nil {
			if len(resp.Kvs) == 0 || resp.Kvs[0].CreateRevision != rev {
				r.watch.mu.Lock()
				if r.watch.keys[h.key] == h {
					r.lostLocked(h)
				}
				r.watch.mu.Unlock()
			}
			return
		}
		if ctx.Err() != nil || r.clientClosed() {
			return
		}
		if pause(ctx, nil) != nil {
			return
		}
	}
}

// runWatch runs the Resource's watch until ctx ends (Close) or the client
// is closed.
func (r *Resource) runWatch(ctx context.Context) {
	w := &r.watch
	defer func() {
		w.mu.Lock()
		w.err = errWatchStopped
		select {
		case <-w.ready:
		default:
			close(w.ready)
		}
		w.mu.Unlock()
	}()
	var from int64 // the next revision to see; 0: from now on
	fresh := false // started afresh: the registered keys need a read
	for {
		opts := []clientv3.OpOption{clientv3.WithPrefix(), clientv3.WithFilterPut(), clientv3.WithCreatedNotify()}
		if from > 0 {
			opts = append(opts, clientv3.WithRev(from))
		}
		wctx, cancel := context.WithCancel(ctx)
		for wr := range r.c.Watch(wctx, r.prefix, opts...) {
			if wr.CompactRevision != 0 { // events were lost: start afresh
				from, fresh = 0, true
				break
			}
			if wr.Canceled {
				break
			}
			if wr.Created {
				if from == 0 {
					from = wr.Header.Revision + 1
					r.watchCreated(ctx, fresh)
					fresh = false
				}
				continue
			}
			for _, ev := range wr.Events {
				r.deleted(string(ev.Kv.Key), ev.Kv.ModRevision)
				from = ev.Kv.ModRevision + 1
			}
		}
		cancel()
		if ctx.Err() != nil || r.clientClosed() {
			return
		}
		t := time.NewTimer(50 * time.Millisecond) // do not spin on a watch that keeps failing
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-t.C:
		}
	}
}

// watchCreated marks the watch ready; after a fresh start (events lost),
// it reads every registered key once, and has keys still being made read
// once their revision is known.
func (r *Resource) watchCreated(ctx context.Context, fresh bool) {
	w := &r.watch
	w.mu.Lock()
	select {
	case <-w.ready:
	default:
		close(w.ready)
	}
	var check []*handle
	var revs []int64
	if fresh {
		for _, h := range w.keys {
			if h.wrev == 0 {
				h.wcheck = true
			} else {
				check, revs = append(check, h), append(revs, h.wrev)
			}
		}
	}
	w.mu.Unlock()
	for i, h := range check {
		r.checkKey(ctx, h, revs[i])
	}
}
