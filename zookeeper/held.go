package zookeeper

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-zookeeper/zk"

	"github.com/distlock/distlock/backend"
)

// armed is a watch set on a znode and not fired yet, with the data
// version the znode had when it was set (it has not changed since).
type armed struct {
	ch      <-chan zk.Event
	version int32
}

// held is one granted lock, the lease's Handle and its Lost (a
// backend.LossSignal). It is what a held lock costs the resource besides
// its watch, so it is kept small (56 bytes): the key is not kept (the
// path says it, see inQueue), a TTL timer is in the resource's timers,
// the Lost channel is made only for a caller that waits on it, and the
// resource's mu guards the fields that change.
type held struct {
	r    *Resource     // that holds it: Done arms the loss watch there
	path string        // the znode's; also the key of its watch in the client
	lost chan struct{} // made by the first Done (under lostMu), closed by fire

	// watch, for a lock the session keeps alive, fires when its znode
	// may have gone: a data watch on the znode (set while it waited, or
	// once something waits for its loss), or the child watch of the
	// listing that granted it (at no cost), which rearm replaces with a
	// data watch at the first change of the queue; unarmed until
	// something waits for its loss, when the grant came with no watch;
	// nil while a request arms it. Guarded by the resource's mu: the
	// session watcher looks at it.
	watch <-chan zk.Event
	sid   int64 // session that owns the znode
	// at is the lock's index in the resource's held, or notHeld once it
	// is done with (released, expired or lost: nothing more to do), and
	// lostAt once fire reported it lost. Written under the resource's mu
	// (but for lostAt, which follows notHeld), read atomically by Closed.
	at   atomic.Int32
	kind backend.Kind // the lease's
	kept bool         // kept alive by the session (Lease.KeptAlive): no TTL timer
}

// track records a granted lock: its loss watch (a lock the session keeps
// alive) or TTL timer (any other), and the lease's fields.
func (r *Resource) track(l *backend.Lease, path string, g grantReply) error {
	if r.conn.SessionID() != g.owner {
		return errVanished
	}
	// Before the lock is in r.held, where poll reads heard.
	r.hear(g.heard)
	h := &held{r: r, path: path, kind: l.Kind, sid: g.owner, kept: l.AutoRenew}
	r.mu.Lock()
	if r.closed {
		r.mu.Unlock()
		return ErrClosed
	}
	if h.kept {
		h.watch = g.watch
		if h.watch == nil { // armed once something waits for a loss (Done)
			h.watch = unarmed
		}
	} else {
		// Under r.mu, once h is in r.held: expire waits for it.
		if r.timers == nil {
			r.timers = make(map[*held]*time.Timer)
		}
		r.timers[h] = time.AfterFunc(l.TTL, func() { r.expire(h) })
	}
	h.at.Store(int32(len(r.held)))
	r.held = append(r.held, h)
	if h.sid != r.sidSeen {
		r.recheck = true
	}
	r.startPollLocked()
	r.mu.Unlock()
	l.Token = uint64(g.token)
	l.Handle = h
	l.Handle = h
	l.KeptAlive = h.kept
	return nil
}

// lostMu guards the lost channel of every held lock: made by the first
// Done call, which only a waiter makes (Lock.Done asked for, loss
// observers), so that a held lock nobody waits on costs no channel; both
// Done and a loss are rare, and the mutex is held for no more than a make
// or a close.
var lostMu sync.Mutex

var _ backend.LossSignal = (*held)(nil)

// Values of held.at once the lock is done with.
const (
	notHeld int32 = -1 // released, expired or lost
	lostAt  int32 = -2 // lost, and reported so (Lost fired)
)

// fire reports h lost: its Lost fires. Called once, by whoever finished
// h (finish returned true: h.at is notHeld).
func (h *held) fire() {
	lostMu.Lock()
	h.at.Store(lostAt)
	if h.lost != nil {
		close(h.lost)
	}
	lostMu.Unlock()
}

// Done returns the channel closed when h is lost, making it. For a lock
// the session keeps alive that has no watch yet, the first Done arms one
// (see armLoss).
func (h *held) Done() <-chan struct{} {
	lostMu.Lock()
	first := h.lost == nil
	if first {
		h.lost = make(chan struct{})
		if h.at.Load() == lostAt {
			close(h.lost)
		}
	}
	ch := h.lost
	lostMu.Unlock()
	if first && h.kept {
		h.r.armLoss(h)
	}
	return ch
}

// unarmed is the watch of a lock its session keeps alive that was granted
// with none, until something waits for its loss: it never fires. A watch
// costs the grant a request, and go-zookeeper keeps a registration of
// about 250 bytes for it, which a lock nobody waits on does without: its
// znode's deletion by another client is then found by Refresh or Release
// (ErrNotHeld), as for a lock with a TTL, and its session's end by the
// session watcher.
var unarmed = make(chan zk.Event)

// armLoss sets a data watch on h's znode unless h has a watch already.
// rearm's read finds a deletion from before, its watch one after.
func (r *Resource) armLoss(h *held) {
	r.mu.Lock()
	arm := h.at.Load() >= 0 && h.watch == unarmed
	if arm {
		h.watch = nil // a request arms it
	}
	r.mu.Unlock()
	if arm {
		go r.rearm(h)
	}
}

// Closed reports whether h was lost.
func (h *held) Closed() bool { return h.at.Load() == lostAt }

// rearmNow is a watch that has fired with no event: the session watcher
// arms the lock's watch again (see rearm).
var rearmNow = func() <-chan zk.Event {
	ch := make(chan zk.Event)
	close(ch)
	return ch
}()

// finish drops h from the held locks and marks it done (stopping its TTL
// timer); false if it already was.
func (r *Resource) finish(h *held) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.finishLocked(h)
}

// finishLocked is finish with r.mu held.
func (r *Resource) finishLocked(h *held) bool {
	at := h.at.Load()
	if at < 0 {
		return false
	}
	last := int32(len(r.held) - 1)
	r.held[at] = r.held[last]
	r.held[at].at.Store(at)
	r.held[last] = nil
	r.held = r.held[:last]
	if c := cap(r.held); c > 1024 && len(r.held) < c/4 {
		// Give back what a crowd of locks, now released, made grow.
		r.held = slices.Clone(r.held)
	}
	h.at.Store(notHeld)
	if !h.kept {
		r.timers[h].Stop()
		delete(r.timers, h)
	}
	return true
}

// tracked reports whether h is held through r.
func (r *Resource) tracked(h *held) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	at := h.at.Load()
	return at >= 0 && int(at) < len(r.held) && r.held[at] == h
}

// expire runs when a lock's TTL ran out without Refresh: it deletes the
// znode, so the next waiter gets the lock, and reports the loss.
func (r *Resource) expire(h *held) {
	if !r.finish(h) {
		return
	}
	h.fire()
	r.later(cleanup{path: h.path})
}

// lose reports the loss of h, whose znode is gone already (deleted by
// another client, or with its session).
func (r *Resource) lose(h *held) {
	if r.finish(h) {
		h.fire()
	}
}

// onWatch handles the event ev of the watch of h, a lock its session
// keeps alive. Its znode is gone when the event says so, or when the
// watch ended with the session (or the connection's Close); any other
// event (a change in the queue, a change of the znode's data) may not be
// about the znode's existence, and rearm looks. The child watch of the
// listing that granted the lock fires at the first change of the queue:
// rearm replaces it with a watch on the znode itself, so that a lock
// costs no request when the queue changes again.
func (r *Resource) onWatch(h *held, ev zk.Event) {
	switch {
	case ev.Err != nil, ev.Type == zk.EventNodeDeleted && ev.Path == h.path:
		r.lose(h)
	default:
		go r.rearm(h)
	}
}

// rearm sets a data watch on h's znode, which tells whether it still
// exists (under h's session). A connection in trouble is the session
// watcher's business (loss deadline): rearm tries again later.
func (r *Resource) rearm(h *held) {
	_, st, ch, err := r.conn.GetW(h.path)
	switch {
	case err == nil && st.EphemeralOwner != h.sid, errors.Is(err, zk.ErrNoNode):
		r.lose(h)
		return
	case err != nil:
		ch = rearmNow
		if sleep(context.Background(), r.stop, rearmBackoff) != nil {
			return // closed
		}
	}
	r.mu.Lock()
	if h.at.Load() >= 0 {
		h.watch = ch
	} // else released or lost: a data watch fires with the deletion
	r.mu.Unlock()
}

// rearmBackoff is how long rearm waits before it tries again after a
// failed request.
const rearmBackoff = 100 * time.Millisecond

// handle returns the znode path of the lock in l.Handle, checked to be
// one of ours for l's key and kind, and that lock if it is still held
// through r (nil once released, expired or lost).
func (r *Resource) handle(op string, l *backend.Lease) (string, *held, error) {
	if r.conn == nil {
		return "", nil, errNotNew
	}
	h, ok := l.Handle.(*held)
	if !ok || h == nil || h.kind != l.Kind || !r.inQueue(h.path, l.Key, l.Kind) {
		return "", nil, fmt.Errorf("zookeeper: %s %q: the lease holds no znode of this resource", op, l.Key)
	}
	if r.tracked(h) {
		return h.path, h, nil
	}
	return h.path, nil, nil
}

// inQueue reports whether path is a child of kindParent(key, kind), as
// strings.HasPrefix(path, r.kindParent(key, kind)+"/") does, with no
// allocation: Release and Refresh check every lease's handle with it.
func (r *Resource) inQueue(path, key string, kind backend.Kind) bool {
	rest, ok := strings.CutPrefix(path, r.cfg.root)
	if !ok || !strings.HasPrefix(rest, "/") {
		return false
	}
	if rest, ok = cutEncodedKey(rest[1:], key); !ok {
		return false
	}
	switch kind {
	case backend.KindSemaphore:
		rest, ok = strings.CutPrefix(rest, semSuffix)
	case backend.KindRead, backend.KindWrite:
		rest, ok = strings.CutPrefix(rest, rwSuffix)
	}
	return ok && strings.HasPrefix(rest, "/")
}

// Release deletes the lock's znode. It returns [backend.ErrNotHeld], with
// no I/O, when the lock was already reported lost or its TTL ran out, and
// ErrNotHeld when the znode is gone (released before, or its session
// expired). Another store error is returned wrapped; the znode is then
// deleted in the background as soon as the connection allows.
//
// A delete the client could not send because it is reconnecting is sent
// again once it has a session, while ctx lasts. Release returns when ctx
// ends, with an error wrapping ctx's: the delete it sent goes on, and is
// retried in the background if it fails; calling Release again sends
// another (ErrNotHeld once the first landed).
func (r *Resource) Release(ctx context.Context, l *backend.Lease) error {
	path, h, err := r.handle("release", l)
	if err != nil {
		return err
	}
	if lost := l.Lost(); lost != nil && lost.Closed() {
		return backend.ErrNotHeld
	}
	if h != nil && !r.finish(h) {
		return backend.ErrNotHeld
	}
	// The delete is sent even when ctx has ended, because a release left
	// undone would hold the lock for others.
	for {
		if ctx.Done() == nil { // never ends: no goroutine needed
			err = r.conn.Delete(path, -1)
		} else {
			pending := send(func() (struct{}, error) { return struct{}{}, r.conn.Delete(path, -1) })
			select {
			case res := <-pending:
				err = res.err
			case <-ctx.Done():
				r.later(cleanup{after: func() (cleanup, bool) {
					res := <-pending
					return cleanup{path: path}, !gone(res.err)
				}})
				return fmt.Errorf("zookeeper: release %q: the server did not answer the delete (it goes on in the background): %w", l.Key, ctx.Err())
			}
		}
		// go-zookeeper fails the requests it has not sent with ErrNoServer
		// when a round of dials fails while it reconnects: that delete was
		// never sent, so it is sent again once there is a session, within
		// ctx (the session, and the znode, may well outlive the
		// disconnection).
		if !errors.Is(err, zk.ErrNoServer) || r.awaitSession(ctx) != nil {
			break
		}
	}
	switch {
	case err == nil:
		return nil
	case errors.Is(err, zk.ErrNoNode):
		return backend.ErrNotHeld
	}
	r.later(cleanup{path: path})
	return r.wrap("release", l.Key, err)
}

// Refresh checks that the lock's znode still exists under its session.
// For a lock with a TTL it also pushes the TTL deletion back by l.TTL (which
// may differ from the TTL it had: Lock.Extend), and writes the new TTL in
// the znode's data, for inspection: one write. A lock the session keeps
// alive has no TTL: Refresh only reads that its znode is there.
//
// It returns [backend.ErrNotHeld] when the znode is gone, the lock was
// reported lost or its TTL already ran out; another store error wrapped
// (the TTL timer runs on then), and ctx's error as soon as ctx ends (the
// request goes on unwatched).
func (r *Resource) Refresh(ctx context.Context, l *backend.Lease) error {
	path, h, err := r.handle("refresh", l)
	if err != nil {
		return err
	}
	if h == nil {
		return backend.ErrNotHeld
	}
	sent := time.Now()
	data := recordOf(l).encode()
	stat, err := call(ctx, func() (*zk.Stat, error) {
		if h.kept {
			exists, stat, err := r.conn.Exists(path)
			if err == nil && !exists {
				err = zk.ErrNoNode
			}
			return stat, err
		}
		return r.conn.Set(path, data, -1)
	})
	return r.answered("refresh", h, l, sent, stat, err)
}

// answered takes in the server's answer to a request about the held lock
// h (a Refresh's or a Relabel's, sent at sent): a znode gone or of another
// session is lost; one that is ours was heard of, and a lock with a TTL
// counts it again from now.
func (r *Resource) answered(op string, h *held, l *backend.Lease, sent time.Time, stat *zk.Stat, err error) error {
	switch {
	case errors.Is(err, zk.ErrNoNode):
		r.lose(h)
		return backend.ErrNotHeld
	case err != nil:
		return r.wrap(op, l.Key, err)
	}
	r.hear(sent)
	if stat.EphemeralOwner != h.sid {
		r.lose(h)
		return backend.ErrNotHeld
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if h.at.Load() < 0 {
		return backend.ErrNotHeld
	}
	if h.kept {
		return nil
	}
	t := r.timers[h]
	if !t.Stop() {
		return backend.ErrNotHeld // the TTL ran out meanwhile: expire runs
	}
	t.Reset(l.TTL)
	return nil
}
