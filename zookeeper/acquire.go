package zookeeper

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/go-zookeeper/zk"

	"github.com/distlock/distlock/backend"
)

// newID returns a resource's id: 64 random bits in hex.
func newID() string {
	var b [8]byte
	_, _ = rand.Read(b[:]) // never fails (crypto/rand)
	return hex.EncodeToString(b[:])
}

// guidLen is the length of a znode's guid: a resource's id and a count,
// 16 hex digits each.
const guidLen = 32

// guidOf writes into g the guid of the znode r creates with count ctr: r's
// id and ctr in 16 hex digits, and returns it.
func (r *Resource) guidOf(g *[guidLen]byte, ctr uint64) []byte {
	n := copy(g[:], r.id)
	for i := guidLen - 1; i >= n; i-- {
		g[i] = "0123456789abcdef"[ctr&15]
		ctr >>= 4
	}
	return g[:]
}

// Acquire queues for l's lock with an ephemeral sequential znode and waits
// until the queue grants it (see judge for each kind's rule), watching
// only what it waits for. On success l.Token is the znode's czxid (see
// "Fencing token" in the package doc), l.Handle the lock (its znode's
// path and state) and l.Lost() the signal that fires when the lock is lost: its session lost, its
// TTL run out (deleted), or, for a lock the session keeps alive (l.AutoRenew:
// then l.KeptAlive is set and no TTL runs), its znode deleted by another
// client.
//
// A zero deadline makes one attempt. It returns [backend.ErrNotAcquired] at
// the deadline, [backend.ErrLimitMismatch] when a semaphore's permit
// queued before it asked for another limit, ctx.Err() when ctx ends,
// [ErrClosed] after Close, and the store's error wrapped with the key
// otherwise; in every failure its znode is deleted (retried in the
// background while the connection is down).
//
// Acquire returns when ctx ends, whatever the server does: a request then
// in flight is left to complete on its own. When its znode may exist (a
// create sent, not answered; a znode whose deletion was not answered),
// the error is a [backend.AbandonedError] wrapping ctx's error (or
// ErrNotAcquired, at the deadline): the znode is deleted in the
// background once the server answers, the create's reply first, and its
// Cleanup waits for that. An abandoned attempt is never granted the lock.
func (r *Resource) Acquire(ctx context.Context, l *backend.Lease, deadline time.Time) error {
	if err := r.ValidateKey(l.Key); err != nil {
		return err
	}
	if err := r.CheckKind(l.Kind); err != nil {
		return err
	}
	if l.Kind == backend.KindSemaphore && l.Limit < 1 {
		return fmt.Errorf("zookeeper: semaphore %q: limit %d below 1", l.Key, l.Limit)
	}
	if r.isClosed() {
		return ErrClosed
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	parent := r.kindParent(l.Key, l.Kind)
	ctr := r.ctr.Add(1)
	var gb [guidLen]byte
	prefix := parent + "/" + guidPrefix + string(r.guidOf(&gb, ctr)) + "-" + tagOf(l) + "-"
	guid := prefix[len(parent)+1+len(guidPrefix):][:guidLen]
	data := recordOf(l).encode()
	c, err := r.create(ctx, parent, prefix, guid, data)
	if err != nil {
		return r.wrap("acquire", l.Key, err)
	}
	path := c.path
	// Read after the create returned: the session the znode was created
	// in, or a later one if that one expired meanwhile (then the znode
	// went with it and the listing finds it gone, or track sees the
	// session changed). Before the create it can be 0, on a connection
	// that has no session yet.
	sid := r.conn.SessionID()
	g, err := r.wait(ctx, l, parent, guid, c, sid, deadline)
	if err == nil {
		err = r.track(l, path, ctr, g)
	}
	if err != nil {
		return r.wrap("acquire", l.Key, r.discard(ctx, cleanup{path: path}, err))
	}
	if g.signal {
		// Tell the waiter behind us that we hold (see judge): a data
		// change of our znode, which it watches. Not waited for: if it
		// fails, that waiter waits for our release instead.
		send(func() (*zk.Stat, error) { return r.conn.Set(path, data, -1) })
	}
	return nil
}

// discard deletes what a failed attempt left (c) and returns err once that
// is done; when ctx ends first, it returns an AbandonedError carrying err,
// whose Cleanup waits for the deletion, which goes on in the background.
func (r *Resource) discard(ctx context.Context, c cleanup, err error) error {
	j := r.later(c)
	select {
	case <-j.done:
		return err
	default:
	}
	select {
	case <-j.done:
		return err
	case <-ctx.Done():
		return r.abandoned(err, ctx, j)
	}
}

// abandoned is the error of an attempt that left j to clean up after it
// when ctx ended (err is why it failed: ctx's error, or ErrNotAcquired).
func (r *Resource) abandoned(err error, ctx context.Context, j *job) error {
	if !errors.Is(err, ctx.Err()) && !errors.Is(err, backend.ErrNotAcquired) {
		err = fmt.Errorf("%w: %w", err, ctx.Err())
	}
	return &backend.AbandonedError{Err: err, Cleanup: j.wait}
}

// created is what a create returned: the znode's path and its czxid, the
// zxid of the transaction that made it (0 when unknown: a create found
// again by its guid after its reply was lost), whether it was then the
// only child of its parent, and when the request that made it was sent.
type created struct {
	path  string
	czxid int64
	alone bool
	sent  time.Time
}

// create makes our ephemeral sequential child of parent, named prefix
// and its sequence number (prefix has the guid, and the tag), and returns
// its path and czxid. The guid in its name finds it again when the reply
// was lost.
//
// The create is a multi-op with a write of the parent's (empty) data: the
// parent's new stat, in the reply, has the zxid of the transaction as
// mzxid, which is our czxid, the fencing token, and the number of its
// children, which tells whether ours is the only one: then it holds the
// lock, with no listing.
//
// When ctx ends with a create in flight, or after a create whose reply
// was lost, the error is an AbandonedError: its job waits for the
// create's reply and deletes what it made, or whatever carries the guid.
func (r *Resource) create(ctx context.Context, parent, prefix, guid string, data []byte) (c created, err error) {
	byGUID := cleanup{parent: parent, guid: guid}
	lostReply := false
	defer func() {
		var ab *backend.AbandonedError
		if err != nil && lostReply && !errors.As(err, &ab) {
			// A create whose reply was lost may still land after we
			// looked: look once more, later.
			j := r.later(byGUID)
			if ctx.Err() != nil {
				err = r.abandoned(err, ctx, j)
			} else {
				err = &backend.AbandonedError{Err: err, Cleanup: j.wait}
			}
		}
	}()
	for range 5 {
		if err = r.awaitSession(ctx); err != nil {
			return created{}, err
		}
		sent := time.Now()
		pending := send(func() (created, error) {
			res, err := r.conn.Multi(
				&zk.CreateRequest{Path: prefix, Data: data, Acl: r.cfg.acl, Flags: zk.FlagEphemeralSequential},
				&zk.SetDataRequest{Path: parent, Version: -1})
			switch {
			case err != nil:
				return created{}, err
			case len(res) != 2 || res[0].String == "" || res[1].Stat == nil:
				// Applied (no error), but the reply says not what: an
				// ambiguous outcome, which the guid settles.
				return created{}, fmt.Errorf("zookeeper: create in %s: unexpected reply %+v", parent, res)
			}
			return created{res[0].String, res[1].Stat.Mzxid, res[1].Stat.NumChildren == 1, sent}, nil
		})
		var res result[created]
		select {
		case res = <-pending:
		case <-ctx.Done():
			// Abandoned in flight: the create may land whenever the
			// server answers. Delete what it made then.
			lost := lostReply
			lostReply = false // the job below covers the guid too
			return created{}, r.abandoned(ctx.Err(), ctx, r.later(cleanup{after: func() (cleanup, bool) {
				res := <-pending
				switch {
				case res.err == nil && !lost:
					return cleanup{path: res.v.path}, true
				case res.err == nil, lost, ambiguous(res.err):
					return byGUID, true
				}
				return cleanup{}, false
			}}))
		}
		err = res.err
		switch {
		case err == nil:
			return res.v, nil
		case errors.Is(err, zk.ErrNoNode):
			// The parent is missing, or the server removed the empty
			// container between our calls: make it and retry.
			if err = r.ensureParents(ctx, parent); err != nil {
				return created{}, err
			}
		case ambiguous(err):
			// The request may have been applied: look for our guid.
			lostReply = true
			found, ferr := r.find(ctx, parent, guid)
			if ferr != nil {
				return created{}, fmt.Errorf("%w; looking for the znode it may have made: %w", err, ferr)
			}
			if found != "" {
				// Ours, from a create whose reply was lost; any other
				// with the guid goes when wait lists the parent. Its
				// czxid is read when it is granted.
				lostReply = false
				return created{path: found}, nil
			}
			// Not applied: create again under the same guid.
		default:
			return created{}, err
		}
	}
	return created{}, err
}

// ambiguous reports whether a failed write may still have been applied.
func ambiguous(err error) bool {
	for _, sure := range []error{
		zk.ErrNoNode, zk.ErrNodeExists, zk.ErrNoServer, zk.ErrSessionExpired,
		zk.ErrClosing, zk.ErrNoAuth, zk.ErrInvalidACL, zk.ErrInvalidPath,
		zk.ErrInvalidFlags, zk.ErrBadArguments, zk.ErrNoChildrenForEphemerals,
		zk.ErrAPIError,
	} {
		if errors.Is(err, sure) {
			return false
		}
	}
	return true
}

// find lists parent for a child carrying guid, retrying a few times while
// the connection comes back. "" when there is none.
func (r *Resource) find(ctx context.Context, parent, guid string) (string, error) {
	var err error
	for i := range 5 {
		var children []string
		children, err = call(ctx, func() ([]string, error) {
			cs, _, err := r.conn.Children(parent)
			return cs, err
		})
		switch {
		case ctx.Err() != nil:
			return "", ctx.Err()
		case err == nil:
			for _, c := range children {
				if strings.Contains(c, guid) {
					return parent + "/" + c, nil
				}
			}
			return "", nil
		case errors.Is(err, zk.ErrNoNode), errors.Is(err, zk.ErrSessionExpired):
			return "", nil // no parent, or our session's nodes died with it
		}
		if serr := sleep(ctx, r.stop, time.Duration(i+1)*100*time.Millisecond); serr != nil {
			return "", fmt.Errorf("%w: %w", err, serr)
		}
	}
	return "", err
}

// ensureParents creates parent and the missing znodes above it: root and
// parent as containers, which the server removes once they are empty, and
// root's ancestors as persistent znodes.
//
// A parent create abandoned in flight (ctx ended) needs no undoing: an
// empty container goes by itself, and root's ancestors are meant to stay.
func (r *Resource) ensureParents(ctx context.Context, parent string) error {
	err := r.createParent(ctx, parent, true)
	if !errors.Is(err, zk.ErrNoNode) {
		return err
	}
	for i := 1; i < len(parent); i++ {
		if parent[i] != '/' {
			continue
		}
		p := parent[:i]
		if err := r.createParent(ctx, p, len(p) >= len(r.cfg.root)); err != nil {
			return err
		}
	}
	return r.createParent(ctx, parent, true)
}

// createParent creates one parent znode; an existing one is fine.
func (r *Resource) createParent(ctx context.Context, path string, container bool) error {
	var err error
	if container && !r.noContainers.Load() {
		_, err = call(ctx, func() (string, error) {
			return r.conn.CreateContainer(path, nil, zk.FlagContainer, r.cfg.acl)
		})
		if err != nil && err.Error() == "unknown error: -6" { // ZUNIMPLEMENTED: server < 3.5
			r.noContainers.Store(true)
		} else if !errors.Is(err, zk.ErrNodeExists) {
			return err
		} else {
			return nil
		}
	}
	_, err = call(ctx, func() (string, error) { return r.conn.Create(path, nil, 0, r.cfg.acl) })
	if errors.Is(err, zk.ErrNodeExists) {
		return nil
	}
	return err
}

// grantReply is what the request that granted a lock tells.
type grantReply struct {
	token int64     // the fencing token: our znode's czxid
	owner int64     // the session owning our znode
	heard time.Time // when a request answered by then was sent: the server had heard from the session
	// watch, for a lock the session keeps alive, fires when its znode
	// may have gone: a data watch on the znode, or the child watch of
	// the listing that granted a semaphore's permit.
	watch  <-chan zk.Event
	signal bool // mark the grant for the waiter behind (see grantSignal)
}

// wait waits until the queue grants our node (see judge), watching only
// what it waits for. c is our create's result, sid the session read after
// it. It returns ctx's error as soon as ctx ends, leaving a request then
// in flight to complete on its own.
//
// A node created alone under its parent holds the lock at once, with no
// listing. Otherwise wait lists the parent and watches what judge says.
// When one child only is between it and the lock (verdict.alone), the
// deletion of that child grants it the lock with no listing: no child
// can queue before a child once it is made. Its own node is there: its
// session is (it got the event), and nothing else deletes it but another
// client. A lock the session keeps alive, which must notice that too,
// watches its own node then (a data watch, sent together with the
// other): its watch would fire first (a session receives its events in
// zxid order), and it lists again. A lock with a TTL notices a deletion
// by another client at its next Refresh or Release, waiting or held.
//
// A lock the session keeps alive keeps, once held, the watch on its node
// when it has one, else the child watch of the listing that granted it
// (free: a listing after a wake-up, or one that may grant, sets one),
// which the session watcher replaces with a watch on the node at the
// first change of the queue (see onWatch); granted with neither (a child
// created alone), it sets one once something waits for its loss
// (held.Done). A semaphore's waiters
// (limit above 1) wait through the child watch of their listings and
// their predecessors' grant marks (see judge).
func (r *Resource) wait(ctx context.Context, l *backend.Lease, parent, guid string, c created, sid int64, deadline time.Time) (g grantReply, err error) {
	path := c.path
	name := path[len(parent)+1:]
	if _, _, ok := sequence(name); !ok {
		return g, fmt.Errorf("server gave %q no sequence number", path)
	}
	kept := l.AutoRenew
	chain := l.Kind == backend.KindSemaphore && l.Limit > 1
	g.owner, g.token, g.heard = sid, c.czxid, c.sent

	// own is the data watch on our node, armed by a GetW in flight
	// (ownSent) or armed already.
	var own <-chan zk.Event
	var ownSent <-chan result[<-chan zk.Event]
	armOwn := func() {
		ownSent = send(func() (<-chan zk.Event, error) {
			_, _, ch, err := r.conn.GetW(path)
			return ch, err
		})
	}
	takeOwn := func() error {
		if ownSent == nil {
			return nil
		}
		select {
		case res := <-ownSent:
			ownSent = nil
			switch {
			case errors.Is(res.err, zk.ErrNoNode):
				return errVanished
			case res.err != nil:
				return res.err
			}
			own = res.v
			return nil
		case <-ctx.Done():
			return ctx.Err()
		}
	}

	if c.alone {
		// The only child: held. A lock the session keeps alive arms its
		// loss watch once something waits for a loss (held.Done).
		return g, nil
	}
	defer r.waitBegins()()
	type listing struct {
		children []string
		watch    <-chan zk.Event
	}
	// The first listing of a mutex or a writer cannot grant: every child
	// there was before ours was made before it. The others may.
	mayGrant := l.Kind != backend.KindMutex && l.Kind != backend.KindWrite
	list := func() (listing, error) {
		if chain || (kept && mayGrant) {
			cs, _, ch, err := r.conn.ChildrenW(parent)
			return listing{cs, ch}, err
		}
		cs, _, err := r.conn.Children(parent)
		return listing{children: cs}, err
	}

	var timer *time.Timer
	defer func() {
		if timer != nil {
			timer.Stop()
		}
	}()
	for {
		sent := time.Now()
		ls, err := call(ctx, list)
		if err != nil {
			return g, err
		}
		g.heard = sent
		r.hear(sent)
		children := ls.children[:0:0]
		for _, c := range ls.children {
			if c != name && strings.Contains(c, guid) {
				// A create we retried after a lost reply landed twice.
				r.later(cleanup{path: parent + "/" + c})
				continue
			}
			children = append(children, c)
		}
		q := queueOf(children, l.Kind)
		i := slices.IndexFunc(q, func(e entry) bool { return e.name == name })
		if i < 0 {
			return g, errVanished
		}
		v := judge(q, i, l.Kind, int(l.Limit))
		switch {
		case v.mismatch:
			return g, backend.ErrLimitMismatch
		case v.hold:
			if g.token == 0 {
				// Found by its guid after a lost reply: read it.
				st, err := call(ctx, func() (*zk.Stat, error) {
					exists, st, err := r.conn.Exists(path)
					if err == nil && !exists {
						err = errVanished
					}
					return st, err
				})
				if err != nil {
					return g, err
				}
				g.token, g.owner = st.Czxid, st.EphemeralOwner
			}
			if kept {
				if err := takeOwn(); err != nil {
					return g, err
				}
				switch {
				case own != nil:
					g.watch = own
				case ls.watch != nil:
					g.watch = ls.watch
				} // else none: armed once something waits for a loss
			}
			g.signal = grantSignal(q, i, l.Kind, int(l.Limit))
			return g, nil
		}
		if deadline.IsZero() || !time.Now().Before(deadline) {
			return g, backend.ErrNotAcquired
		}
		mayGrant = true // the next listing comes after a change
		var ch <-chan zk.Event
		if v.children {
			ch = ls.watch // any change of the queue
		} else {
			if kept && v.alone && own == nil && ownSent == nil {
				armOwn() // sent together with the watch on the predecessor
			}
			var version int32
			ch, version, err = r.watch(ctx, parent+"/"+v.watch)
			if err == nil {
				err = takeOwn()
			}
			switch {
			case errors.Is(err, zk.ErrNoNode):
				continue // gone already: list again
			case err != nil:
				return g, err
			case v.signal && version > 0:
				continue // it holds already: list again
			}
		}
		if timer == nil {
			timer = time.NewTimer(time.Until(deadline))
		}
		select {
		case ev := <-ch:
			// The event, or a zero one when another wait on the same
			// watch took it: list again, unless it says that the only
			// child before ours went.
			if ev.Err != nil {
				return g, ev.Err
			}
			if v.alone && ev.Type == zk.EventNodeDeleted && ev.Path == parent+"/"+v.watch && g.token != 0 && (own != nil || !kept) {
				select {
				case ev := <-own: // never when own is nil
					// Our node changed first: list again to see.
					if ev.Err != nil {
						return g, ev.Err
					}
					own = nil
				default:
					g.watch = own
					return g, nil
				}
			}
		case ev := <-own:
			if ev.Err != nil {
				return g, ev.Err
			}
			if ev.Type == zk.EventNodeDeleted {
				return g, errVanished
			}
			own = nil // changed: armed again before the next wait
		case <-timer.C:
			return g, backend.ErrNotAcquired
		case <-ctx.Done():
			return g, ctx.Err()
		case <-r.stop:
			return g, ErrClosed
		}
	}
}

var errVanished = errors.New("our znode vanished while queued (session expired?)")

// watch returns a channel that receives (or is closed) when the znode at
// path changes or goes, with the data version the znode had when the
// watch was set, or zk.ErrNoNode when it is gone already.
//
// The protocol go-zookeeper speaks cannot remove a watch: a wait that
// gives up leaves its watch armed until the znode changes, on the server
// and in the client. The next wait on the same znode uses that watch
// instead of setting another, so that waits that give up again and again
// (a process polling a long-held lock) keep one watch per predecessor,
// not one per wait. An armed watch says the znode has not changed since
// it was set, and it fires when it does: no need to look at the znode
// again. It is a data watch (getData), as Curator sets: unlike exists, it
// leaves no watch behind when the znode is already gone. A session that
// ends closes every watch channel (go-zookeeper invalidates them), so a
// watch is never shared across sessions.
//
// The request that sets a watch is abandoned when ctx ends; when it
// returns, its watch is kept for the next wait all the same.
func (r *Resource) watch(ctx context.Context, path string) (<-chan zk.Event, int32, error) {
	r.wmu.Lock()
	w, ok := r.watches[path]
	if ok && fired(w.ch) {
		delete(r.watches, path)
		ok = false
	}
	r.wmu.Unlock()
	if ok {
		return w.ch, w.version, nil
	}
	w, err := call(ctx, func() (armed, error) {
		_, st, ch, err := r.conn.GetW(path)
		if err != nil {
			return armed{}, err
		}
		w := armed{ch, st.Version}
		r.keepWatch(path, w)
		return w, nil
	})
	return w.ch, w.version, err
}

// keepWatch records the armed watch w on path for the next waits.
func (r *Resource) keepWatch(path string, w armed) {
	r.wmu.Lock()
	defer r.wmu.Unlock()
	if r.watches == nil { // closed
		return
	}
	if len(r.watches) >= r.pruneAt {
		for p, w := range r.watches {
			if fired(w.ch) {
				delete(r.watches, p)
			}
		}
		r.pruneAt = max(64, 2*len(r.watches))
	}
	r.watches[path] = w
}

// fired reports whether a watch channel has delivered its event (it may
// take the event: whoever waits on the channel then sees it closed).
func fired(ch <-chan zk.Event) bool {
	select {
	case <-ch:
		return true
	default:
		return false
	}
}
