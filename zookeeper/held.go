package zookeeper

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
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

// held is one granted lock, the lease's Handle and its loss signal (a
// backend.LossSignal). It is what a held lock costs the resource, so it is
// kept small (64 bytes, a size class): its znode's path is
// not kept but made again when needed (see path), from the lease's key
// (the same string, shared) and the parts of the name that vary; a TTL
// timer, and the loss watch of a lock the session keeps alive, are in the
// resource's maps (timers, lossWatch), for the locks that have one; the
// Lost channel is made only for a caller that waits on it; the
// resource's mu guards the fields that change.
type held struct {
	r    *Resource     // that holds it: Done arms the loss watch there
	key  string        // the lease's Key: the parent of the znode (with kind)
	lost chan struct{} // made by the first Done (under lostMu), closed by fire
	sid  int64         // session that owns the znode
	ctr  uint64        // the znode's name: its guid is the resource's id and ctr (see guidOf)
	seq  uint32        // the znode's sequence number (see sequence)
	// at is the lock's index in the resource's held, or notHeld once it
	// is done with (released, expired or lost: nothing more to do), and
	// lostAt once fire reported it lost. Written under the resource's mu
	// (but for lostAt, which follows notHeld), read atomically by Closed.
	at    atomic.Int32
	limit int32        // a semaphore's limit, in the znode's tag (tagOf)
	kind  backend.Kind // the lease's
	kept  bool         // kept alive by the session (Lease.KeptAlive): no TTL timer
}

// path returns the path of h's znode:
// kindParent(key, kind) + "/" + guidPrefix + guid + "-" + tag + "-" + the
// sequence number as the server writes it (%010d of its signed 32 bits),
// made in one allocation.
func (h *held) path() string {
	var b strings.Builder
	b.Grow(h.pathLen())
	b.WriteString(h.r.cfg.root)
	b.WriteByte('/')
	writeEncodedKey(&b, h.key)
	b.WriteString(kindSuffix(h.kind))
	b.WriteString("/" + guidPrefix)
	var g [guidLen]byte
	b.Write(h.r.guidOf(&g, h.ctr))
	b.WriteByte('-')
	writeTagTo(&b, h.kind, int(h.limit))
	b.WriteByte('-')
	var n [12]byte
	b.Write(seqText(n[:0], h.seq))
	return b.String()
}

// pathLen is the length of h.path().
func (h *held) pathLen() int {
	var n [12]byte
	return len(h.r.cfg.root) + 1 + encodedKeyLen(h.key) + len(kindSuffix(h.kind)) + 1 + len(guidPrefix) +
		guidLen + 1 + tagLen(h.kind, int(h.limit)) + 1 + len(seqText(n[:0], h.seq))
}

// isPath reports whether p is h's znode path, with no allocation.
func (h *held) isPath(p string) bool {
	rest, ok := strings.CutPrefix(p, h.r.cfg.root)
	if !ok || !strings.HasPrefix(rest, "/") {
		return false
	}
	if rest, ok = cutEncodedKey(rest[1:], h.key); !ok {
		return false
	}
	if rest, ok = strings.CutPrefix(rest, kindSuffix(h.kind)+"/"+guidPrefix); !ok {
		return false
	}
	var g [guidLen]byte
	if rest, ok = strings.CutPrefix(rest, string(h.r.guidOf(&g, h.ctr))); !ok || !strings.HasPrefix(rest, "-") {
		return false
	}
	var t [16]byte
	if rest, ok = strings.CutPrefix(rest[1:], string(appendTag(t[:0], h.kind, int(h.limit)))); !ok || !strings.HasPrefix(rest, "-") {
		return false
	}
	var n [12]byte
	return rest[1:] == string(seqText(n[:0], h.seq))
}

// seqText appends the sequence number seq as ZooKeeper writes it in a
// name: %010d of its signed 32 bits (see sequence).
func seqText(b []byte, seq uint32) []byte {
	v := int64(int32(seq))
	if v < 0 {
		b = append(b, '-')
		v = -v
		if v < 1e9 {
			b = append(b, "000000000"[:9-digits(v)]...)
		}
		return strconv.AppendInt(b, v, 10)
	}
	b = append(b, "0000000000"[:10-digits(v)]...)
	return strconv.AppendInt(b, v, 10)
}

// digits is the number of decimal digits of v > 0 (1 for 0).
func digits(v int64) int {
	n := 1
	for v >= 10 {
		v /= 10
		n++
	}
	return n
}

// track records a granted lock, its znode at path: its loss watch (a
// lock the session keeps alive) or TTL timer (any other), and the
// lease's fields.
func (r *Resource) track(l *backend.Lease, path string, ctr uint64, g grantReply) error {
	if r.conn.SessionID() != g.owner {
		return errVanished
	}
	seq, _, ok := sequence(path)
	h := &held{r: r, key: l.Key, kind: l.Kind, limit: l.Limit, sid: g.owner, ctr: ctr, seq: seq, kept: l.AutoRenew}
	if !ok || !h.isPath(path) {
		return fmt.Errorf("server named the znode %q, not as this client makes it again", path)
	}
	// Before the lock is in r.held, where poll reads heard.
	r.hear(g.heard)
	r.mu.Lock()
	if r.closed {
		r.mu.Unlock()
		return ErrClosed
	}
	if h.kept {
		// Without a watch, armed once something waits for a loss (Done).
		if g.watch != nil {
			if r.lossWatch == nil {
				r.lossWatch = make(map[*held]<-chan zk.Event)
			}
			r.lossWatch[h] = g.watch
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

// armLoss sets a data watch on h's znode unless h has a watch already
// (r.lossWatch). rearm's read finds a deletion from before, its watch
// one after. A lock its session keeps alive that was granted with no
// watch has none until something waits for its loss: a watch costs the
// grant a request, and go-zookeeper keeps a registration of about 250
// bytes for it, which a lock nobody waits on does without: its znode's
// deletion by another client is then found by Refresh or Release
// (ErrNotHeld), as for a lock with a TTL, and its session's end by the
// session watcher.
func (r *Resource) armLoss(h *held) {
	r.mu.Lock()
	_, armed := r.lossWatch[h]
	arm := h.at.Load() >= 0 && !armed
	if arm {
		if r.lossWatch == nil {
			r.lossWatch = make(map[*held]<-chan zk.Event)
		}
		r.lossWatch[h] = nil // a request arms it
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
	} else {
		delete(r.lossWatch, h)
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
	r.later(cleanup{path: h.path()})
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
	case ev.Err != nil, ev.Type == zk.EventNodeDeleted && h.isPath(ev.Path):
		r.lose(h)
	default:
		go r.rearm(h)
	}
}

// rearm sets a data watch on h's znode, which tells whether it still
// exists (under h's session). A connection in trouble is the session
// watcher's business (loss deadline): rearm tries again later.
func (r *Resource) rearm(h *held) {
	_, st, ch, err := r.conn.GetW(h.path())
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
	if h.at.Load() >= 0 && r.lossWatch != nil {
		r.lossWatch[h] = ch
	} // else released or lost: a data watch fires with the deletion
	r.mu.Unlock()
}

// rearmBackoff is how long rearm waits before it tries again after a
// failed request.
const rearmBackoff = 100 * time.Millisecond

// handle returns the znode path of the lock in l.Handle, checked to be
// one of r's for l's key and kind, and that lock if it is still held
// through r (nil once released, expired or lost).
func (r *Resource) handle(op string, l *backend.Lease) (string, *held, error) {
	if r.conn == nil {
		return "", nil, errNotNew
	}
	h, ok := l.Handle.(*held)
	if !ok || h == nil || h.r != r || h.kind != l.Kind || h.key != l.Key || h.limit != l.Limit {
		return "", nil, fmt.Errorf("zookeeper: %s %q: the lease holds no znode of this resource", op, l.Key)
	}
	if r.tracked(h) {
		return h.path(), h, nil
	}
	return h.path(), nil, nil
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
