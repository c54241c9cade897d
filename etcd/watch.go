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
// Resource: a lock costs its place in the table of names in use (a
// chain link and a share of a bucket), not a watch of its own (whose
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
	on      atomic.Bool   // started, read without the mutex

	// names holds every handle whose name is in use (see take); those
	// registered for the loss signal have bitWatched set.
	names nameTable
	// wdel is the latest deletion of a registered handle's name seen
	// while its key was being made or released (bitReleasing).
	wdel map[*handle]int64
}

var errWatchStopped = errors.New("key watch stopped")

// watchKey registers h, whose key does not exist yet and whose name is
// in use (take), for the loss signal. It fails only once the watch has
// stopped (Close, the client closed). It does no I/O: the watch starts
// when something waits for a loss (needWatch).
func (r *Resource) watchKey(h *handle) error {
	w := &r.watch
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.err != nil {
		return w.err
	}
	h.clear(bitMade | bitCheck | bitReleasing)
	h.set(bitWatched)
	delete(w.wdel, h)
	return nil
}

// wdelOf is the latest deletion of h's name seen while h's key was being
// made or released, 0 if none. w.mu is held.
func (w *keyWatch) wdelOf(h *handle) int64 { return w.wdel[h] }

// sawDeletion records a deletion of h's name at rev while h's key was
// being made or released. w.mu is held.
func (w *keyWatch) sawDeletion(h *handle, rev int64) {
	if rev <= w.wdel[h] {
		return
	}
	if w.wdel == nil {
		w.wdel = make(map[*handle]int64)
	}
	w.wdel[h] = rev
}

// wrev is h's key's create revision as the watch knows it: 0 while it is
// being made. w.mu is held.
func wrev(h *handle) int64 {
	if !h.has(bitMade) {
		return 0
	}
	return h.rev
}

// watched reports whether h is registered for the loss signal. w.mu is held.
func watched(h *handle) bool { return h.has(bitWatched) }

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
//
// rev is h.rev, written before: the watch reads h.rev once bitMade is set.
func (r *Resource) keyMade(h *handle, rev int64) bool {
	w := &r.watch
	w.mu.Lock()
	if !watched(h) {
		w.mu.Unlock()
		return false
	}
	h.set(bitMade)
	if w.wdelOf(h) > rev {
		r.lostLocked(h)
		w.mu.Unlock()
		return false
	}
	check := h.has(bitCheck)
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
	if on {
		h.set(bitReleasing)
	} else {
		h.clear(bitReleasing)
	}
	if !on && watched(h) && w.wdelOf(h) > wrev(h) {
		r.lostLocked(h)
	}
}

// unwatchKey forgets h: it was released or its acquisition failed.
func (r *Resource) unwatchKey(h *handle) {
	w := &r.watch
	w.mu.Lock()
	r.unwatchLocked(h)
	w.mu.Unlock()
}

// unwatchLocked is unwatchKey with w.mu held.
func (r *Resource) unwatchLocked(h *handle) {
	h.clear(bitWatched)
	delete(r.watch.wdel, h)
}

// deleted is called for every deletion under the prefix.
func (r *Resource) deleted(key string, rev int64) {
	kind, limit, lockKey, slot, ok := r.parseName(key)
	if !ok {
		return // not one of our queue keys
	}
	w := &r.watch
	w.mu.Lock()
	defer w.mu.Unlock()
	h := w.names.find(kind, limit, lockKey, slot)
	if h == nil || !watched(h) {
		return
	}
	switch made := wrev(h); {
	case h.has(bitFired) && made != 0 && rev > made: // its lease was lost; now the key is gone
		r.unwatchLocked(h)
		r.freeLocked(h)
	case made == 0 || h.has(bitReleasing): // being made (an older key of the name, or ours), or released
		w.sawDeletion(h, rev)
	case rev > made:
		r.lostLocked(h)
	}
}

// lostLocked closes h's Lost and forgets h; the key is known gone, so its
// name is free again. w.mu is held.
func (r *Resource) lostLocked(h *handle) {
	r.unwatchLocked(h)
	closeLost(h)
	r.freeLocked(h)
}

// closeLost fires h's Lost unless it fired already. The watch's mutex is
// held: only holders of it fire Lost.
func closeLost(h *handle) {
	if h.has(bitFired) {
		return
	}
	lostMu.Lock()
	h.set(bitFired)
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
		if h.has(bitFired) {
			close(h.lost)
		}
	}
	ch := h.lost
	lostMu.Unlock()
	h.resource().needWatch()
	return ch
}

// Closed reports whether h's Lost fired.
func (h *handle) Closed() bool { return h.has(bitFired) }

// sessionLost closes the Lost of every lock registered on s, whose lease
// is lost. The locks stay registered until their key is seen deleted (the
// lease expires: the key watch, which this starts, sees it), released or
// forgotten, so that their names are not used again before.
func (r *Resource) sessionLost(s *session) {
	w := &r.watch
	w.mu.Lock()
	any := false
	w.names.each(func(h *handle) {
		if watched(h) && h.sess == s {
			closeLost(h)
			any = true
		}
	})
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
		w.names.each(func(h *handle) {
			switch {
			case !watched(h):
			case wrev(h) == 0:
				h.set(bitCheck)
			default:
				check, revs = append(check, h), append(revs, h.rev)
			}
		})
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
		ops[i] = clientv3.OpGet(r.name(h).key, clientv3.WithKeysOnly())
	}
	for {
		resp, err := r.c.Txn(ctx).Then(ops...).Commit()
		if err == nil {
			w := &r.watch
			w.mu.Lock()
			for i, h := range hs {
				kvs := resp.Responses[i].GetResponseRange().Kvs
				switch {
				case len(kvs) == 1 && kvs[0].CreateRevision == revs[i], !watched(h):
				case h.has(bitReleasing): // our release deleted it, unless it fails (see releasing)
					w.sawDeletion(h, resp.Header.Revision)
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
