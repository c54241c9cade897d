package etcd

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
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
// its prefix, other processes' releases and its own included: so the
// watch starts only when something waits for a loss (the first Done of
// any lock's Lost, or a shared lease lost), and runs from then until
// Close. A Resource whose locks nobody waits on pays nothing for it: its
// cycle is a transaction and a delete.
//
// Every lock is registered before the transaction that makes its key.
// When the watch is created (first, or afresh after etcd compacted past
// the last event it saw), every registered key is read once, and a key
// still being made is read once its revision is known: a deletion before
// the watch's creation is found by the read, one after it comes through
// the watch. The watch resumes after the last event seen when it breaks.
type keyWatch struct {
	mu      sync.Mutex
	started bool
	ready   chan struct{} // closed once the watch is first created and the keys read, or stopped
	err     error         // why the watch stopped (Close, client closed)
	keys    map[string]*handle
	on      atomic.Bool // started, read without the mutex
}

var errWatchStopped = errors.New("key watch stopped")

// watchKey registers h, whose key does not exist yet, for the loss
// signal. It fails only once the watch has stopped (Close, the client
// closed). It does no I/O: the watch starts when something waits for a
// loss (needWatch).
func (r *Resource) watchKey(h *handle) error {
	w := &r.watch
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.err != nil {
		return w.err
	}
	if w.keys == nil {
		w.keys = make(map[string]*handle)
	}
	h.wrev, h.wdel, h.wcheck, h.wrel = 0, 0, false, false
	w.keys[h.key] = h
	return nil
}

// needWatch starts the Resource's key watch unless it runs already.
func (r *Resource) needWatch() {
	w := &r.watch
	if w.on.Load() {
		return
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.started {
		return
	}
	w.started = true
	w.on.Store(true)
	w.ready = make(chan struct{})
	if w.keys == nil {
		w.keys = make(map[string]*handle)
	}
	if !r.background(r.runWatch) {
		w.err = errors.New("resource closed")
		close(w.ready)
	}
}

// watchReady returns the channel closed once the key watch was first
// created and the keys registered then were read (or it stopped), nil
// while it has not started. For tests.
func (r *Resource) watchReady() <-chan struct{} {
	w := &r.watch
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.ready
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

// Done returns the channel closed when h's Lost fires, making it, and
// starts the Resource's key watch if it does not run yet.
func (h *handle) Done() <-chan struct{} {
	lostMu.Lock()
	if h.lost == nil {
		h.lost = make(chan struct{})
		if h.fired.Load() {
			close(h.lost)
		}
	}
	ch := h.lost
	lostMu.Unlock()
	h.r.needWatch()
	return ch
}

// Closed reports whether h's Lost fired.
func (h *handle) Closed() bool { return h.fired.Load() }

// sessionLost closes the Lost of every lock registered on s, whose lease
// is lost. The locks stay registered until their key is seen deleted (the
// lease expires: the key watch, which this starts, sees it), released or
// forgotten, so that their names are not used again before.
func (r *Resource) sessionLost(s *session) {
	w := &r.watch
	w.mu.Lock()
	any := false
	for _, h := range w.keys {
		if h.sess == s {
			closeLost(h)
			any = true
		}
	}
	w.mu.Unlock()
	if any {
		// The watch sees their keys go, and frees their names.
		r.needWatch()
	}
}

// checkKey reads h's key once and reports the loss if it is gone.
func (r *Resource) checkKey(ctx context.Context, h *handle, rev int64) {
	r.checkKeys(ctx, []*handle{h}, []int64{rev})
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
	fresh := true  // started afresh: the registered keys need a read
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

// watchCreated marks the watch ready; after a fresh start (the first,
// or events lost), it reads every registered key once first, and has keys
// still being made read once their revision is known.
func (r *Resource) watchCreated(ctx context.Context, fresh bool) {
	w := &r.watch
	var check []*handle
	var revs []int64
	if fresh {
		w.mu.Lock()
		for _, h := range w.keys {
			if h.wrev == 0 {
				h.wcheck = true
			} else {
				check, revs = append(check, h), append(revs, h.wrev)
			}
		}
		w.mu.Unlock()
	}
	for len(check) > 0 {
		n := min(len(check), checkBatch)
		r.checkKeys(ctx, check[:n], revs[:n])
		check, revs = check[n:], revs[n:]
	}
	w.mu.Lock()
	select {
	case <-w.ready:
	default:
		close(w.ready)
	}
	w.mu.Unlock()
}

// checkBatch is how many keys checkKeys reads in one transaction (etcd
// refuses more than 128 operations in one by default).
const checkBatch = 64

// checkKeys reads the keys of hs in one transaction and reports the loss
// of those gone (or made again: another create revision than revs').
func (r *Resource) checkKeys(ctx context.Context, hs []*handle, revs []int64) {
	ops := make([]clientv3.Op, len(hs))
	for i, h := range hs {
		ops[i] = clientv3.OpGet(h.key, clientv3.WithKeysOnly())
	}
	for {
		resp, err := r.c.Txn(ctx).Then(ops...).Commit()
		if err == nil {
			w := &r.watch
			w.mu.Lock()
			for i, h := range hs {
				kvs := resp.Responses[i].GetResponseRange().Kvs
				switch {
				case len(kvs) == 1 && kvs[0].CreateRevision == revs[i], w.keys[h.key] != h:
				case h.wrel: // our release deleted it, unless it fails (see releasing)
					h.wdel = max(h.wdel, resp.Header.Revision)
				default:
					r.lostLocked(h)
				}
			}
			w.mu.Unlock()
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
