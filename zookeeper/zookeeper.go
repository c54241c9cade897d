package zookeeper

import (
	"context"
	"errors"
	"fmt"
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
// (Lease.Lost() fired) when nine tenths of d have passed since it sent the
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

	// id is 64 random bits in hex, and ctr counts the creates: the guid
	// in the name of every znode the resource makes is id and the
	// count (guidOf), unique across resources as a random guid is, and
	// kept by a held lock in 8 bytes.
	id  string
	ctr atomic.Uint64

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
	// lossWatch has the loss watch of each held lock the session keeps
	// alive that has one: it fires when the lock's znode may have gone
	// (a data watch on the znode, set while it waited or once something
	// waits for its loss, or the child watch of the listing that granted
	// it, which rearm replaces with a data watch at the first change of
	// the queue); nil while a request arms it. A lock nobody waits on for
	// a loss, the many, has none (see armLoss).
	lossWatch map[*held]<-chan zk.Event
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
		id:      newID(),
	}, nil
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
	return r.parentPath(key) + kindSuffix(kind)
}

// kindSuffix is what follows the encoded key in the name of the parent of
// kind (see semSuffix).
func kindSuffix(kind backend.Kind) string {
	switch kind {
	case backend.KindSemaphore:
		return semSuffix
	case backend.KindRead, backend.KindWrite:
		return rwSuffix
	}
	return ""
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
		h.at.Store(notHeld)
	}
	for _, t := range r.timers {
		t.Stop()
	}
	r.timers, r.lossWatch = nil, nil
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
		h.fire()
		p := h.path()
		ds = append(ds, deletion{p, r.later(cleanup{path: p})})
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
