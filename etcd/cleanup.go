package etcd

import (
	"context"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
)

// Clean-ups (the delete of a failed acquisition's key, the revoke of a
// lease that holds nothing more) run once in the caller's goroutine. One
// that fails (the connection dropped under it, no leader) is retried in
// the background until it succeeds, the client is closed or the Resource
// is: a queue key left behind would block the lock for every later waiter
// as long as its lease lives, and the Resource keeps a shared lease alive
// until Close.

// Retries start after firstRetry and double up to lastRetry.
const (
	firstRetry = 50 * time.Millisecond
	lastRetry  = time.Second
)

// later runs clean in the background, again and again with growing pauses,
// until it reports that nothing is left to do, the client is closed or
// [Resource.Close] is called. Each run gets a context bounded by
// cleanupTimeout.
func (r *Resource) later(clean func(ctx context.Context) bool) {
	if r.clientClosed() {
		return // what is left expires with its lease
	}
	ctx, cancel := context.WithCancel(context.Background())
	r.mu.Lock()
	if r.closed {
		r.mu.Unlock()
		cancel()
		return
	}
	r.nextRetry++
	id := r.nextRetry
	r.retries[id] = cancel
	r.bg.Add(1)
	r.mu.Unlock()
	go func() {
		defer r.bg.Done()
		defer func() {
			r.mu.Lock()
			delete(r.retries, id)
			r.mu.Unlock()
			cancel()
		}()
		t := time.NewTimer(firstRetry)
		defer t.Stop()
		for pause := firstRetry; ; pause = min(2*pause, lastRetry) {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
			if r.clientClosed() {
				return // what is left expires with its lease
			}
			cctx, ccancel := context.WithTimeout(ctx, cleanupTimeout)
			done := clean(cctx)
			ccancel()
			if done {
				return
			}
			t.Reset(pause)
		}
	}()
}

// stopRetries ends the background clean-ups and waits for them (Close).
func (r *Resource) stopRetries() {
	r.mu.Lock()
	for _, cancel := range r.retries {
		cancel()
	}
	r.mu.Unlock()
	r.bg.Wait()
}

// revokeSoon revokes a lease, retrying in the background if it fails,
// and calls gone (if not nil) once the lease is known gone.
func (r *Resource) revokeSoon(ctx context.Context, id clientv3.LeaseID, gone func()) {
	if r.revoke(ctx, id) {
		if gone != nil {
			gone()
		}
		return
	}
	r.later(func(ctx context.Context) bool {
		if !r.revokeNow(ctx, id) {
			return false
		}
		if gone != nil {
			gone()
		}
		return true
	})
}

// deleteSoon deletes h's key if it is still ours and gives its name back,
// retrying in the background if the delete fails. A key on a shared
// lease still there a TTL after the first try makes the Resource give the
// lease up, as the TTL timer does: the lease then expires on the server,
// with the key, and the retries end once they find it gone.
func (r *Resource) deleteSoon(ctx context.Context, h *handle) {
	if r.deleteKey(ctx, h) {
		r.free(h)
		return
	}
	r.deleteLater(h, time.Now().Add(h.ttl))
}

// deleteLater retries the delete of h's key in the background and gives
// its name back once the key is gone. After giveUp it gives h's shared
// lease up.
func (r *Resource) deleteLater(h *handle, giveUp time.Time) {
	r.later(func(ctx context.Context) bool {
		if _, err := r.deleteOurs(ctx, h); err == nil {
			r.free(h)
			return true
		}
		if h.sess != nil && time.Now().After(giveUp) {
			h.sess.abandon()
		}
		return false
	})
}
