package zookeeper

import (
	"context"
	"crypto/rand"
	"encoding/hex"
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

var (
	_ backend.Waiter       = (*Resource)(nil)
	_ backend.Refresher    = (*Resource)(nil)
	_ backend.KeyValidator = (*Resource)(nil)
	_ backend.KindChecker  = (*Resource)(nil)
	_ backend.Inspector    = (*Resource)(nil)
)

// ErrClosed is returned by [Resource.Acquire] after [Resource.Close], and
// by a wait that Close interrupts.
var ErrClosed = errors.New("zookeeper: resource closed")

// errNotNew is the error of every call of a Resource not made by New.
var errNotNew = fmt.Errorf("zookeeper: %w: a Resource not made by New", backend.ErrInvalid)

// DefaultRoot is the znode under which locks live unless [WithRoot] says
// otherwise.
const DefaultRoot = "/distlock"

// pollInterval is how often the session watcher samples the connection
// while locks are held or waits are in progress.
const pollInterval = 25 * time.Millisecond

// With [WithSessionTimeout](d), the session watcher asks the server for
// something while locks are held or waits are in progress once no request sent in the last
// d/probeDivisor was answered (go-zookeeper pings as often), and reports
// them lost once no request sent in the last d - d/marginDivisor -
// pollInterval was answered (see lossDeadline).
const (
	probeDivisor  = 3
	marginDivisor = 10
)

// scanEvery is how many poll intervals pass between two looks at the
// watches of the locks the session keeps alive.
const scanEvery = 4

// Option configures a [Resource]. A bad value makes [New] fail.
type Option func(*config) error

type config struct {
	root      string
	acl       []zk.ACL
	tolerance time.Duration
}

// WithRoot puts the locks under root instead of [DefaultRoot]. root must be
// an absolute znode path other than "/" and outside /zookeeper; [New]
// fails for another root. Missing ancestors of root are created as persistent znodes; root and the
// per-key parents below it as container znodes.
func WithRoot(root string) Option {
	return func(c *config) error {
		if err := validRoot(root); err != nil {
			return err
		}
		c.root = root
		return nil
	}
}

// WithACL sets the ACL of the znodes the resource creates. Default:
// zk.WorldACL(zk.PermAll). An empty ACL makes [New] fail.
func WithACL(acl ...zk.ACL) Option {
	return func(c *config) error {
		if len(acl) == 0 {
			return errors.New("WithACL: empty ACL")
		}
		c.acl = acl
		return nil
	}
}

// WithSessionTimeout tells the resource the session timeout the connection
// negotiated (the one given to zk.Connect, unless the server clamped it to
// its [2, 20] tickTime bounds). While locks are held or waits are in
// progress, the resource then sends the server a small read when it has
// answered none for d/3 (as often as go-zookeeper pings it), and reports the locks lost
// (Lease.Lost closed) when nine tenths of d have passed since it sent the
// last request the server answered: the server cannot expire the session
// before d has passed since it last heard from the client, so Lost closes
// a tenth of d before the earliest moment another client can be granted
// the lock, however the connection failed (refused, reset, or silent with
// the connection left open). A lock survives a disconnection if the client
// is back in session before that deadline; go-zookeeper waits a second
// before it dials again a server list it went through.
//
// Default 0: go-zookeeper does not expose the negotiated timeout, so without
// this option every observed disconnection counts as loss, which is safe
// but drops locks on short network blips (a silent connection is noticed
// by go-zookeeper's receive timeout, 2/3 of the session timeout after the
// last reply). Do not pass more than the real session timeout: the lock
// could then be granted to another client while this one still believes
// it holds it. d < 0 makes [New] fail.
func WithSessionTimeout(d time.Duration) Option {
	return func(c *config) error {
		if d < 0 {
			return fmt.Errorf("WithSessionTimeout(%v): negative", d)
		}
		c.tolerance = d
		return nil
	}
}

// Resource is a ZooKeeper lock store: a [backend.Waiter] for
// distlock.New. It is safe for concurrent use. Build it with [New].
type Resource struct {
	conn *zk.Conn
	cfg  config

	noContainers atomic.Bool // the server rejected CreateContainer

	// epoch is the monotonic origin of heard, which is the latest moment
	// the server is known to have heard from this client: the send time
	// of the latest request it answered, in nanoseconds since epoch.
	epoch time.Time
	heard atomic.Int64

	mu sync.Mutex
	// held lists the locks held through this resource, each at its
	// held.at: a slice, not a map by path, because it is what a held
	// lock costs the resource (8 bytes), and the lease's Handle finds
	// its lock without a lookup.
	held []*held
	// timers are the TTL timers of the held locks that are not kept
	// alive by the session (each deletes its znode when it fires): a
	// lock the session keeps, the many, has no field for one.
	timers map[*held]*time.Timer
	// waiting counts the waits in progress that count a loss deadline
	// (WithSessionTimeout): the session watcher runs while there are
	// locks held or waits in progress.
	waiting int
	polling bool
	closed  bool
	stop    chan struct{} // closed by Close: waits and the session watcher end
	// wg counts the session watcher, which Close waits for. The
	// goroutines that may wait for the server (requests, probes, jobs)
	// are not counted: Close does not wait for a server that does not
	// answer; they end when the client gives their request up.
	wg sync.WaitGroup

	// sidSeen is the session the watcher last checked the held locks
	// against; recheck asks it to check them again (a lock was added
	// under another session). Guarded by mu.
	sidSeen int64
	recheck bool

	// Watches set on predecessors and not fired yet, shared by the waits
	// on the same predecessor: see watch.
	wmu     sync.Mutex
	watches map[string]armed
	pruneAt int
}

// armed is a watch set on a znode and not fired yet, with the data
// version the znode had when it was set (it has not changed since).
type armed struct {
	ch      <-chan zk.Event
	version int32
}

// held is one granted lock, and the lease's Handle. It is what a held
// lock costs the resource besides its Lost channel and its watch, so it
// is kept small (48 bytes): the key is not kept (the path says it, see
// inQueue), a TTL timer is in the resource's timers, and the resource's
// mu guards the fields that change.
type held struct {
	path string        // the znode's; also the key of its watch in the client
	lost chan struct{} // Lease.Lost

	// watch, for a lock the session keeps alive, fires when its znode
	// may have gone: a data watch on the znode (set while it waited, or
	// when it was granted), or the child watch of the listing that
	// granted it (at no cost), which rearm replaces with a data watch at
	// the first change of the queue. nil while a request arms it.
	// Guarded by the resource's mu: the session watcher looks at it.
	watch <-chan zk.Event
	sid   int64 // session that owns the znode
	// at is the lock's index in the resource's held, or -1 once it is
	// done with (released, expired or lost: nothing more to do).
	// Guarded by the resource's mu.
	at   int32
	kind backend.Kind // the lease's
	kept bool         // kept alive by the session (Lease.KeptAlive): no TTL timer
}

// New returns a Resource that keeps its locks on conn. The caller owns conn
// and closes it after the resource; the resource never closes it. New does
// no I/O.
//
// New returns an error wrapping [backend.ErrInvalid] (distlock.ErrInvalid)
// for a nil conn, a nil option or a bad option value ([WithRoot],
// [WithACL], [WithSessionTimeout] say which).
func New(conn *zk.Conn, opts ...Option) (*Resource, error) {
	if conn == nil {
		return nil, fmt.Errorf("zookeeper: New: %w: nil *zk.Conn", backend.ErrInvalid)
	}
	cfg := config{root: DefaultRoot, acl: zk.WorldACL(zk.PermAll)}
	for _, o := range opts {
		if o == nil {
			return nil, fmt.Errorf("zookeeper: New: %w: nil option", backend.ErrInvalid)
		}
		if err := o(&cfg); err != nil {
			return nil, fmt.Errorf("zookeeper: New: %w: %w", backend.ErrInvalid, err)
		}
	}
	return &Resource{
		conn:    conn,
		cfg:     cfg,
		epoch:   time.Now(),
		stop:    make(chan struct{}),
		watches: make(map[string]armed),
	}, nil
}

// hear records that the server answered a request sent at sent: it had
// heard from this client's session at sent or later.
func (r *Resource) hear(sent time.Time) {
	t := int64(sent.Sub(r.epoch))
	for {
		old := r.heard.Load()
		if t <= old || r.heard.CompareAndSwap(old, t) {
			return
		}
	}
}

// lossDeadline is when the held locks must be reported lost, with
// [WithSessionTimeout](d): the server cannot expire the session before d
// after it last heard from the client, which is at or after r.heard. The
// watcher looks every poll interval, so it closes Lost by 0.9 x d after
// r.heard; the last tenth of d is the margin for its lateness and for
// the two clocks' rates.
func (r *Resource) lossDeadline() time.Time {
	d := r.cfg.tolerance
	return r.epoch.Add(time.Duration(r.heard.Load()) + d - d/marginDivisor - pollInterval)
}

// ValidateKey returns an error, with no I/O, for a key the resource cannot
// hold: an empty key, a key longer than [MaxKeyLen] bytes, or any key on a
// Resource not made by [New]. Every other
// key is fine: it is escaped into one znode name, different keys into
// different names.
func (r *Resource) ValidateKey(key string) error {
	switch {
	case r.conn == nil:
		return errNotNew
	case key == "":
		return errors.New("zookeeper: empty key")
	case len(key) > MaxKeyLen:
		return fmt.Errorf("zookeeper: key of %d bytes is longer than %d", len(key), MaxKeyLen)
	}
	return nil
}

// parentPath is the znode whose children queue for key's mutex.
func (r *Resource) parentPath(key string) string {
	return r.cfg.root + "/" + encodeKey(key)
}

// kindParent is the znode whose children queue for key's lock of kind:
// each kind has its own (see semSuffix).
func (r *Resource) kindParent(key string, kind backend.Kind) string {
	switch kind {
	case backend.KindSemaphore:
		return r.parentPath(key) + semSuffix
	case backend.KindRead, backend.KindWrite:
		return r.parentPath(key) + rwSuffix
	}
	return r.parentPath(key)
}

// CheckKind implements [backend.KindChecker]: the resource holds every
// kind of lock, each on the queue of a parent znode of its own (see
// "Semaphores and read/write locks" in the package doc).
func (r *Resource) CheckKind(k backend.Kind) error {
	switch k {
	case backend.KindMutex, backend.KindSemaphore, backend.KindRead, backend.KindWrite:
		return nil
	}
	return fmt.Errorf("zookeeper: unknown kind of lock %v", k)
}

func newGUID() string {
	var b [16]byte
	_, _ = rand.Read(b[:]) // never fails (crypto/rand)
	return hex.EncodeToString(b[:])
}

// Acquire queues for l's lock with an ephemeral sequential znode and waits
// until the queue grants it (see judge for each kind's rule), watching
// only what it waits for. On success l.Token is the znode's czxid (see
// "Fencing token" in the package doc), l.Handle the lock (its znode's
// path and state) and l.Lost a channel closed when the lock is lost: its session lost, its
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
	guid := newGUID()
	data := recordOf(l).encode()
	c, err := r.create(ctx, parent, guid, tagOf(l), data)
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
		err = r.track(l, path, g)
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

// wrap adds op and key to store errors; sentinels and bare context errors
// pass as they are.
func (r *Resource) wrap(op, key string, err error) error {
	if errors.Is(err, backend.ErrNotAcquired) || errors.Is(err, backend.ErrNotHeld) ||
		errors.Is(err, backend.ErrLimitMismatch) || errors.Is(err, ErrClosed) ||
		err == context.Canceled || err == context.DeadlineExceeded {
		return err
	}
	return fmt.Errorf("zookeeper: %s %q: %w", op, key, err)
}

// sessionPoll is how often awaitSession looks at the connection's state.
const sessionPoll = 5 * time.Millisecond

// awaitSession returns once the connection has a session, or is in a
// state where a request fails at once (closed, expired), or with an error
// when ctx ends first. go-zookeeper keeps a request made while it is
// connecting in its queue and sends it once it has a session: a create
// queued so and abandoned could still be applied later, and would need a
// clean-up. Made only with a session, a create that ctx cut short before
// one came was never sent: against a server that refuses connections an
// attempt fails with nothing to undo. go-zookeeper has no event for the
// session but the caller's channel: this polls its state, within ctx.
func (r *Resource) awaitSession(ctx context.Context) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	var t *time.Ticker
	for {
		switch st := r.conn.State(); st {
		case zk.StateConnecting, zk.StateConnected:
			if t == nil {
				t = time.NewTicker(sessionPoll)
				defer t.Stop()
			}
			select {
			case <-t.C:
			case <-ctx.Done():
				return fmt.Errorf("%w: no session with %s yet (the client is %v; it logs why): %w", zk.ErrNoServer, r.conn.Server(), st, ctx.Err())
			}
		default:
			return nil
		}
	}
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

// create makes our ephemeral sequential child of parent, named with guid
// and tag, and returns its path and czxid. The guid in its name finds it
// again when the reply was lost.
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
func (r *Resource) create(ctx context.Context, parent, guid, tag string, data []byte) (c created, err error) {
	prefix := parent + "/" + guidPrefix + guid + "-" + tag + "-"
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

// grant is what the request that granted a lock tells.
type grant struct {
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
// A lock the session keeps alive needs a loss watch once held: the watch
// on its node when it has one, else the child watch of the listing that
// granted it (free: a listing after a wake-up, or one that may grant,
// sets one), which the session watcher replaces with a watch on the node
// at the first change of the queue (see onWatch). A semaphore's waiters
// (limit above 1) wait through the child watch of their listings and
// their predecessors' grant marks (see judge).
func (r *Resource) wait(ctx context.Context, l *backend.Lease, parent, guid string, c created, sid int64, deadline time.Time) (g grant, err error) {
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
		// The only child: held.
		if kept {
			armOwn()
			if err := takeOwn(); err != nil {
				return g, err
			}
			g.watch = own
		}
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
		v := judge(q, i, l.Kind, l.Limit)
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
				default:
					g.watch = rearmNow // the session watcher arms one
				}
			}
			g.signal = grantSignal(q, i, l.Kind, l.Limit)
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

// track records a granted lock: its loss watch (a lock the session keeps
// alive) or TTL timer (any other), and the lease's fields.
func (r *Resource) track(l *backend.Lease, path string, g grant) error {
	if r.conn.SessionID() != g.owner {
		return errVanished
	}
	// Before the lock is in r.held, where poll reads heard.
	r.hear(g.heard)
	h := &held{path: path, kind: l.Kind, sid: g.owner, kept: l.AutoRenew, lost: make(chan struct{})}
	r.mu.Lock()
	if r.closed {
		r.mu.Unlock()
		return ErrClosed
	}
	if h.kept {
		h.watch = g.watch
		if h.watch == nil { // no child watch: arm one on the znode at once
			h.watch = rearmNow
		}
	} else {
		// Under r.mu, once h is in r.held: expire waits for it.
		if r.timers == nil {
			r.timers = make(map[*held]*time.Timer)
		}
		r.timers[h] = time.AfterFunc(l.TTL, func() { r.expire(h) })
	}
	h.at = int32(len(r.held))
	r.held = append(r.held, h)
	if h.sid != r.sidSeen {
		r.recheck = true
	}
	r.startPollLocked()
	r.mu.Unlock()
	l.Token = uint64(g.token)
	l.Handle = h
	l.Lost = h.lost
	l.KeptAlive = h.kept
	return nil
}

// startPollLocked starts the session watcher unless it runs; r.mu is
// held.
func (r *Resource) startPollLocked() {
	if !r.polling {
		r.polling = true
		r.wg.Add(1)
		go r.poll()
	}
}

// waitBegins records a wait in progress, with [WithSessionTimeout]: the
// session watcher then probes the server as it does while locks are held
// (see poll), so that when the wait is granted (by an event, with no
// request of its own) the loss deadline counts from a request answered
// less than a third of the session timeout before, not from the listing
// made before the wait began. The returned function ends the wait.
func (r *Resource) waitBegins() (ends func()) {
	if r.cfg.tolerance <= 0 {
		return func() {}
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closed {
		return func() {}
	}
	r.waiting++
	r.startPollLocked()
	return func() {
		r.mu.Lock()
		r.waiting--
		r.mu.Unlock()
	}
}

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
	if h.at < 0 {
		return false
	}
	last := int32(len(r.held) - 1)
	r.held[h.at] = r.held[last]
	r.held[h.at].at = h.at
	r.held[last] = nil
	r.held = r.held[:last]
	if c := cap(r.held); c > 1024 && len(r.held) < c/4 {
		// Give back what a crowd of locks, now released, made grow.
		r.held = slices.Clone(r.held)
	}
	h.at = -1
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
	return h.at >= 0 && int(h.at) < len(r.held) && r.held[h.at] == h
}

// expire runs when a lock's TTL ran out without Refresh: it deletes the
// znode, so the next waiter gets the lock, and reports the loss.
func (r *Resource) expire(h *held) {
	if !r.finish(h) {
		return
	}
	close(h.lost)
	r.later(cleanup{path: h.path})
}

// lose reports the loss of h, whose znode is gone already (deleted by
// another client, or with its session).
func (r *Resource) lose(h *held) {
	if r.finish(h) {
		close(h.lost)
	}
}

// poll watches the connection while locks are held or waits are in
// progress (waitBegins): a changed session id
// means the old session expired with our znodes. Without
// [WithSessionTimeout] any disconnection may have lost them; with it, it
// probes the server (see probe) and reports the locks lost at
// lossDeadline, when the server has not answered for most of the session
// timeout, whether the connection looks up or not. It also looks at the
// watches of the locks the session keeps alive (see onWatch).
func (r *Resource) poll() {
	defer r.wg.Done()
	t := time.NewTicker(pollInterval)
	defer t.Stop()
	d := r.cfg.tolerance
	var probing chan struct{} // closed when the probe in flight returns
	type event struct {
		h  *held
		ev zk.Event
	}
	var events []event
	for tick := 1; ; tick++ {
		select {
		case <-t.C:
		case <-r.stop:
			return
		}
		sid, state, now := r.conn.SessionID(), r.conn.State(), time.Now()
		if d > 0 && state == zk.StateHasSession && (probing == nil || isClosedChan(probing)) &&
			now.Sub(r.epoch.Add(time.Duration(r.heard.Load()))) >= d/probeDivisor {
			probing = make(chan struct{})
			// Not counted in r.wg: Close does not wait for a server
			// that does not answer. It ends when the client gives up.
			go r.probe(probing)
		}
		var lost []*held
		events = events[:0]
		r.mu.Lock()
		// Read under r.mu: track records heard before it adds a lock.
		down := state != zk.StateHasSession
		if d > 0 {
			down = !now.Before(r.lossDeadline())
		}
		if down || sid != r.sidSeen || r.recheck {
			// Backwards: finishLocked moves the last lock, already
			// seen, into the place of the one it drops.
			for i := len(r.held) - 1; i >= 0; i-- {
				if h := r.held[i]; down || h.sid != sid {
					r.finishLocked(h)
					lost = append(lost, h)
				}
			}
			r.sidSeen, r.recheck = sid, false
		}
		if tick%scanEvery == 0 {
			for _, h := range r.held {
				if h.watch == nil {
					continue
				}
				select {
				case ev := <-h.watch:
					h.watch = nil
					events = append(events, event{h, ev})
				default:
				}
			}
		}
		last := len(r.held) == 0 && r.waiting == 0
		if last {
			r.polling = false
		}
		r.mu.Unlock()
		for _, h := range lost {
			close(h.lost)
			if h.sid == sid {
				// The session may live on: free the lock for others.
				r.later(cleanup{path: h.path})
			}
		}
		for _, e := range events {
			r.onWatch(e.h, e.ev)
		}
		if last {
			return
		}
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
	if h.at >= 0 {
		h.watch = ch
	} // else released or lost: a data watch fires with the deletion
	r.mu.Unlock()
}

// rearmBackoff is how long rearm waits before it tries again after a
// failed request.
const rearmBackoff = 100 * time.Millisecond

// probe sends the server a small read and records when it was sent if
// the server answers: any answer counts, the server heard from the
// session (go-zookeeper's own pings are answered out of our sight).
func (r *Resource) probe(done chan struct{}) {
	defer close(done)
	sent := time.Now()
	if _, _, err := r.conn.Exists(r.cfg.root); err == nil {
		r.hear(sent)
	}
}

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
// Release returns when ctx ends, with an error wrapping ctx's: the delete
// it sent goes on, and is retried in the background if it fails; calling
// Release again sends another (ErrNotHeld once the first landed).
func (r *Resource) Release(ctx context.Context, l *backend.Lease) error {
	path, h, err := r.handle("release", l)
	if err != nil {
		return err
	}
	if isClosedChan(l.Lost) {
		return backend.ErrNotHeld
	}
	if h != nil && !r.finish(h) {
		return backend.ErrNotHeld
	}
	// The delete is sent even when ctx has ended, because a release left
	// undone would hold the lock for others.
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
	switch {
	case errors.Is(err, zk.ErrNoNode):
		r.lose(h)
		return backend.ErrNotHeld
	case err != nil:
		return r.wrap("refresh", l.Key, err)
	}
	r.hear(sent)
	if stat.EphemeralOwner != h.sid {
		r.lose(h)
		return backend.ErrNotHeld
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if h.at < 0 {
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

// Close deletes the znodes of the locks still held through r (closing
// their Lost channels), stops the session watcher, and makes Acquire
// return [ErrClosed]. It does not close the connection. It waits for the
// deletions at most a second; those the server has not answered by
// then go on in the background, as do the deletions of abandoned
// attempts, until they are done or the connection is closed. Close is
// idempotent; it returns an error naming the deletions not done.
func (r *Resource) Close() error {
	r.mu.Lock()
	if r.closed {
		r.mu.Unlock()
		return nil
	}
	r.closed = true
	hs := r.held
	r.held = nil
	for _, h := range hs {
		h.at = -1
	}
	for _, t := range r.timers {
		t.Stop()
	}
	r.timers = nil
	r.mu.Unlock()
	r.wmu.Lock()
	r.watches = nil // the watches fire or end with the connection
	r.wmu.Unlock()

	close(r.stop)
	type deletion struct {
		path string
		j    *job
	}
	var ds []deletion
	for _, h := range hs {
		close(h.lost)
		ds = append(ds, deletion{h.path, r.later(cleanup{path: h.path})})
	}
	t := time.NewTimer(closeWait)
	defer t.Stop()
	var errs []error
	expired := false
	for _, d := range ds {
		if !expired {
			select {
			case <-d.j.done:
				continue
			case <-t.C:
				expired = true
			}
		}
		select {
		case <-d.j.done:
		default:
			errs = append(errs, fmt.Errorf("zookeeper: close: delete %s: not done within %v; it goes on in the background", d.path, closeWait))
		}
	}
	r.wg.Wait()
	return errors.Join(errs...)
}

// closeWait bounds how long [Resource.Close] waits for the server.
const closeWait = time.Second

func (r *Resource) isClosed() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.closed
}

// sleep waits d, or returns an error when ctx ends or stop closes first.
func sleep(ctx context.Context, stop <-chan struct{}, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	case <-stop:
		return ErrClosed
	}
}

func isClosedChan(ch <-chan struct{}) bool {
	if ch == nil {
		return false
	}
	select {
	case <-ch:
		return true
	default:
		return false
	}
}
