package redis

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"net"
	"runtime"
	"sync"
	"sync/atomic"
	"time"
	"weak"

	goredis "github.com/redis/go-redis/v9"

	"github.com/distlock/distlock/backend"
	"github.com/distlock/distlock/internal/redisscript"
)

// DefaultPrefix is the key prefix used unless [WithPrefix] says otherwise.
// It is the Redlock store's too, so a lock key is named alike on both.
const DefaultPrefix = redisscript.DefaultPrefix

// MaxKeyLen is the longest lock key, in bytes, that [Resource.ValidateKey]
// accepts. Redis itself takes keys up to 512 MB; a lock name is short, and a
// longer one is almost surely a mistake (a payload passed as a key).
const MaxKeyLen = redisscript.MaxKeyLen

// ErrNotReplicated is returned (wrapped) by [Resource.TryAcquire] under
// [WithWaitReplicas] when fewer replicas than asked acknowledged the lock in
// time. The lock has then been released again.
var ErrNotReplicated = errors.New("redis: lock not replicated")

var errNilClient = errors.New("redis: nil client")

// cleanupTimeout bounds one try of the clean-up of a failed acquire (the
// facade tries again, with backoff, while it has not answered): a try
// stuck on a connection that will never answer gives way to one on a
// fresh connection.
const cleanupTimeout = time.Second

var (
	_ backend.Spinner      = (*Resource)(nil)
	_ backend.Refresher    = (*Resource)(nil)
	_ backend.Notifier     = (*Resource)(nil)
	_ backend.KeyValidator = (*Resource)(nil)
	_ io.Closer            = (*Resource)(nil)
)

// Resource is a lock store on one Redis deployment: a standalone server, a
// Sentinel-managed master or a Redis Cluster. It is safe for concurrent use.
// Create it with [New]; pass it to distlock.New.
type Resource struct {
	c       goredis.UniversalClient
	cluster *goredis.ClusterClient // c, when it is a Cluster client
	// bounded says that c bounds the I/O of a request by its context's
	// deadline when the context is an acquisition's (see boundedView).
	bounded bool
	prefix  string
	publish any // redisscript.Publish or ShardedPublish, boxed once

	waitReplicas int
	waitTimeout  time.Duration

	ttl atomic.Value // the last TTL in milliseconds, boxed (see boxMillis)

	hub *hub

	// Requests run on worker goroutines in batches (see dispatch.go).
	mu        sync.Mutex
	queue     []*call     // the calls waiting for the next batch, under mu
	live      int         // batches in flight that a caller waits for, under mu
	tasks     chan *batch // hands a batch to an idle worker; unbuffered
	quit      chan struct{}
	closeOnce sync.Once
}

// workerIdle is how long a worker goroutine waits for the next request
// before it exits.
const workerIdle = 2 * time.Second

// Option configures a [Resource].
type Option func(*Resource)

// WithPrefix sets the prefix of every key and channel the Resource uses.
// The default is [DefaultPrefix] ("distlock:"). An empty prefix is allowed.
// Its '%', '{' and '}' are percent-escaped like the key's, so the hash tag
// Redis Cluster sees is always the key's.
func WithPrefix(prefix string) Option {
	return func(r *Resource) { r.prefix = prefix }
}

// WithWaitReplicas makes each acquire wait until n replicas acknowledged
// the lock (Redis WAIT n timeout, sent in the same round trip as the acquire
// script, on the same connection). When fewer acknowledge within timeout,
// TryAcquire releases the lock again and returns an error wrapping
// [ErrNotReplicated]. This narrows, without closing, the window in which a
// Sentinel failover to a replica that never saw the lock lets a second owner
// in. The default is n = 0: no waiting. n <= 0 disables the option; a
// timeout under 1ms is raised to 1ms (WAIT 0 would block forever). The
// timeout must be shorter than the client's ReadTimeout (3s by default),
// which bounds the pipeline's reply. Over a *goredis.Ring the WAIT may go
// to another shard: do not combine the two.
func WithWaitReplicas(n int, timeout time.Duration) Option {
	return func(r *Resource) {
		if n <= 0 {
			r.waitReplicas = 0
			return
		}
		r.waitReplicas = n
		r.waitTimeout = max(timeout, time.Millisecond)
	}
}

// New returns a Resource that keeps locks in the Redis behind c: a
// *goredis.Client (standalone), a Sentinel *goredis.Client from
// NewFailoverClient, or a *goredis.ClusterClient. The caller owns c: the
// Resource never closes it. New does no I/O.
//
// An acquisition's request runs on the caller's goroutine, bounded by the
// acquisition's deadline, when the client bounds its I/O by its context's
// deadline and the caller's context cannot be cancelled; otherwise it
// waits for its reply from another goroutine. A *goredis.Client built
// without ContextTimeoutEnabled is given that bound for the Resource's
// requests only: the first New over it adds a hook to it, after its own
// hooks, which sends them through a view of the client (same pool) that
// has ContextTimeoutEnabled; its other requests are as before. A Cluster
// or Ring client has it when built with ContextTimeoutEnabled.
//
// New returns an error wrapping [backend.ErrInvalid] (distlock.ErrInvalid)
// for a nil c or a nil option.
func New(c goredis.UniversalClient, opts ...Option) (*Resource, error) {
	if isNil(c) {
		return nil, fmt.Errorf("redis: New: %w: nil client", backend.ErrInvalid)
	}
	r := &Resource{c: c, prefix: DefaultPrefix, publish: redisscript.Publish,
		tasks: make(chan *batch), quit: make(chan struct{})}
	r.bounded = boundedView(c)
	if cc, ok := c.(*goredis.ClusterClient); ok {
		r.cluster = cc
		r.publish = redisscript.ShardedPublish
	}
	for _, o := range opts {
		if o == nil {
			return nil, fmt.Errorf("redis: New: %w: nil option", backend.ErrInvalid)
		}
		o(r)
	}
	if _, ring := c.(*goredis.Ring); !ring {
		// A Ring has no one server to subscribe on: no wake-up.
		r.hub = newHub(c, r.cluster)
	}
	return r, nil
}

// boundedView makes c bound the I/O of the Resource's requests by their
// context's deadline (go-redis's ContextTimeoutEnabled) when their context
// is an acquisition's (see send), and reports whether it does: a request
// whose context can end only at its deadline then runs on the caller's
// goroutine and still returns by it.
//
// A *goredis.Client built without ContextTimeoutEnabled gets a view of
// itself with it (WithTimeout, with its own timeouts: it shares the
// client's connection pool) and a hook, added last, so innermost: after
// every hook the client has, which see the requests as before, it sends
// the Resource's bounded requests (their context is an *ioContext, or a
// batch's) through the view; every other request goes on as before. A
// Cluster or Ring client is bounded if it was built with
// ContextTimeoutEnabled. A client that sets no I/O deadlines at all (a
// negative ReadTimeout or WriteTimeout) is not bounded. A client gets
// one view and one hook, the first time a Resource is made over it;
// hooks added to it after that are inner to the view's, and do not see
// the bounded requests.
func boundedView(c goredis.UniversalClient) bool {
	deadlines := func(read, write time.Duration) bool { return read >= 0 && write >= 0 }
	switch c := c.(type) {
	case *goredis.Client:
		o := c.Options()
		if !deadlines(o.ReadTimeout, o.WriteTimeout) {
			return false
		}
		if o.ContextTimeoutEnabled {
			return true
		}
		key := weak.Make(c)
		if _, ok := views.Load(key); ok {
			return true // an earlier Resource over c added the hook
		}
		viewsMu.Lock()
		defer viewsMu.Unlock()
		if _, ok := views.Load(key); ok {
			return true
		}
		v := c.WithTimeout(o.ReadTimeout)
		vo := v.Options() // the view's own copy
		vo.WriteTimeout = o.WriteTimeout
		vo.ContextTimeoutEnabled = true
		c.AddHook(viewHook{v})
		views.Store(key, struct{}{})
		runtime.AddCleanup(c, func(k weak.Pointer[goredis.Client]) { views.Delete(k) }, key)
		return true
	case *goredis.ClusterClient:
		o := c.Options()
		return o.ContextTimeoutEnabled && deadlines(o.ReadTimeout, o.WriteTimeout)
	case *goredis.Ring:
		o := c.Options()
		return o.ContextTimeoutEnabled && deadlines(o.ReadTimeout, o.WriteTimeout)
	}
	return false
}

// views holds the clients boundedView gave a view and its hook, so that
// one client gets one hook however many Resources are made over it; an
// entry goes with its client.
var (
	views   sync.Map // weak.Pointer[goredis.Client] -> struct{}
	viewsMu sync.Mutex
)

// viewHook sends the Resource's bounded requests through view, a
// ContextTimeoutEnabled view of the client it is added to (see
// boundedView). A WithTimeout view has none of the client's hooks: they
// ran already, outside this one.
type viewHook struct{ view *goredis.Client }

func (viewHook) DialHook(next goredis.DialHook) goredis.DialHook { return next }

func (h viewHook) ProcessHook(next goredis.ProcessHook) goredis.ProcessHook {
	return func(ctx context.Context, cmd goredis.Cmder) error {
		if _, ok := ctx.(*ioContext); ok {
			return h.view.Process(ctx, cmd)
		}
		return next(ctx, cmd)
	}
}

func (h viewHook) ProcessPipelineHook(next goredis.ProcessPipelineHook) goredis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []goredis.Cmder) error {
		if _, ok := ctx.(deadlineContext); !ok {
			return next(ctx, cmds)
		}
		pipe := h.view.Pipeline()
		for _, cmd := range cmds {
			_ = pipe.Process(ctx, cmd)
		}
		_, err := pipe.Exec(ctx)
		return err
	}
}

// isNil reports whether c is nil, or a nil pointer of one of go-redis's
// client types.
func isNil(c goredis.UniversalClient) bool {
	switch c := c.(type) {
	case nil:
		return true
	case *goredis.Client:
		return c == nil
	case *goredis.ClusterClient:
		return c == nil
	case *goredis.Ring:
		return c == nil
	}
	return false
}

// handle is an acquisition's state, kept in backend.Lease.Handle from an
// attempt to the next one (the facade's spin loop makes many with one
// lease): the key names and the acquire command, built and boxed once
// and reused by every attempt (go-redis only reads them). A held lock
// keeps none of it: TryAcquire drops the handle when it acquires, and
// Release and Refresh build their command per call (in the call's own
// arrays, see scriptCall), so that a process holding many locks pays
// only for the leases themselves.
type handle struct {
	key     string    // the user's key, to detect a foreign Handle
	value   string    // the owner value the commands were built from
	ms      int64     // the TTL in acq
	labeled bool      // acq carries a label, and the lock a label key
	waits   bool      // acq asks a refused attempt to queue (backend.Lease.Waits)
	marked  bool      // acq's value carries redisscript.WaitedMark (an attempt was refused)
	keys    [2]string // lock, fence
	acq     [10]any   // EVALSHA acquire 2 lock fence value ms [label [waits publish]]
}

// handles are reused: a handle goes back when its acquisition ends
// with the lock taken, when nothing refers to it any longer.
var handles = sync.Pool{New: func() any { return new(handle) }}

// acqCmd returns the acquire command.
func (h *handle) acqCmd() []any {
	switch {
	case h.waits:
		return h.acq[:]
	case h.labeled:
		return h.acq[:8]
	}
	return h.acq[:7]
}

// Script digests, boxed once.
var (
	acquireSHA      any = redisscript.Acquire.Hash()
	cleanupSHA      any = redisscript.Cleanup.Hash()
	releaseSHA      any = redisscript.Release.Hash()
	extendSHA       any = redisscript.Extend.Hash()
	semAcquireSHA   any = redisscript.SemAcquire.Hash()
	rwAcquireSHA    any = redisscript.RWAcquire.Hash()
	groupReleaseSHA any = redisscript.GroupRelease.Hash()
	groupExtendSHA  any = redisscript.GroupExtend.Hash()
	groupCleanupSHA any = redisscript.GroupCleanup.Hash()
	rwWithdrawSHA   any = redisscript.RWWithdraw.Hash()
	withdrawSHA     any = redisscript.Withdraw.Hash()
	inspectSHA      any = redisscript.Inspect.Hash()
	multiAcquireSHA any = redisscript.MultiAcquire.Hash()
)

// labelFlag is the scripts' argument that says a lock has a label key;
// fenceFlag, Extend's that says it has a fence; traceFlag, Release's that
// asks for a trace; waitsFlag, the acquire scripts' that says the
// acquisition waits (a refused attempt queues); noFlag says no.
var labelFlag, fenceFlag, traceFlag, waitsFlag, noFlag any = "1", "1", "1", "1", ""

// boxMillis returns ms as a command argument. A process usually locks
// with one TTL: the last one is kept boxed, and reused while it does not
// change (an int64 over 255 costs an allocation to box).
func (r *Resource) boxMillis(ms int64) any {
	if v := r.ttl.Load(); v != nil && v.(int64) == ms {
		return v
	}
	v := any(ms)
	r.ttl.Store(v)
	return v
}

func (r *Resource) newHandle(l *backend.Lease) *handle {
	h := handles.Get().(*handle)
	h.key, h.value, h.ms, h.labeled, h.waits, h.marked = l.Key, l.Value, redisscript.Millis(l.TTL), l.Label != "", l.Waits, false
	h.keys[0], h.keys[1] = redisscript.Layout(r.prefix, l.Key)
	h.acq = [10]any{"evalsha", acquireSHA, 2, h.keys[0], h.keys[1], l.Value, r.boxMillis(h.ms), l.Label, waitsFlag, r.publish}
	return h
}

// free gives h back for reuse. Nothing may refer to it any longer: no
// lease, no clean-up, no request in flight.
func (h *handle) free() {
	*h = handle{}
	handles.Put(h)
}

// lockKey returns the name of l's lock key.
func (r *Resource) lockKey(l *backend.Lease) string {
	lock, _ := redisscript.Layout(r.prefix, l.Key)
	return lock
}

// await runs f in a goroutine of its own and returns true when it
// returned, or false when ctx ended first; f then runs on, and what it
// writes must not be read.
func await(ctx context.Context, f func()) bool {
	done := ctx.Done()
	if done == nil {
		f()
		return true
	}
	if ctx.Err() != nil {
		return false
	}
	ch := make(chan struct{}, 1)
	go func() {
		f()
		ch <- struct{}{}
	}()
	select {
	case <-ch:
		return true
	case <-done:
		select {
		case <-ch:
			return true
		default:
			return false
		}
	}
}

// checkValue refuses a mutex's owner value that ends with
// redisscript.WaitedMark, which the scripts could not tell from its marked
// form (a lock an attempt of another value was refused), or starts with a
// NUL byte, which marks a lock kept for the head of its line.
func checkValue(l *backend.Lease) error {
	if v := l.Value; v == "" || v[len(v)-1] == redisscript.WaitedMark[0] || v[0] == 0 {
		return fmt.Errorf("redis: acquire %q: %w: an owner value must not be empty nor start or end with a NUL byte", l.Key, backend.ErrInvalid)
	}
	return nil
}

// ValidateKey implements [backend.KeyValidator]: it rejects an empty key and
// one longer than [MaxKeyLen] bytes. Any bytes are allowed, braces included.
func (r *Resource) ValidateKey(key string) error {
	return redisscript.ValidateKey("redis", key)
}

// TryAcquire implements [backend.Spinner] with one script call (EVALSHA):
// SET lock value NX PX ttl and, on success, the next token from the fence
// (max(last token + 1, the server's time in microseconds): see the package
// doc), which becomes l.Token. When the key is held it returns false and
// the holder's remaining time. It returns when ctx ends, whatever the
// server does.
//
// On any error but a failed dial (see notSent: nothing was sent, nothing
// is cleaned up) the request may have run, or may still run (its reply was
// lost, or ctx ended before it came): the attempt is then cleaned up with
// one script that deletes the key if it holds l.Value and writes l.Value's
// tombstone for one TTL, so that the request sets nothing should it reach
// Redis only after that (delayed on the network, or queued in a server
// that stopped answering). While ctx lives TryAcquire runs the clean-up
// itself and returns the error wrapped with op and key. When ctx ended,
// or the clean-up could not be made before it did, it returns a
// *[backend.AbandonedError] whose Cleanup makes it (the facade runs it in
// the background until it succeeds); its Err wraps ctx's error if ctx
// ended. l.Value is given up either way: an attempt with it fails until
// the tombstone expires (the facade never makes one: an error ends its
// acquisition).
func (r *Resource) TryAcquire(ctx context.Context, l *backend.Lease) (bool, time.Duration, error) {
	if r.c == nil {
		return false, 0, errNilClient
	}
	if err := ctx.Err(); err != nil { // nothing sent: nothing to clean
		return false, 0, fmt.Errorf("redis: acquire %q: %w", l.Key, err)
	}
	// PX takes whole milliseconds: round up and say so in l.TTL.
	ms := redisscript.Millis(l.TTL)
	// Past math.MaxInt64 ns the product would wrap negative: keep l.TTL, then
	// under 1ms short of what the store holds (the safe side).
	if ms <= math.MaxInt64/int64(time.Millisecond) {
		l.TTL = time.Duration(ms) * time.Millisecond
	}
	if l.Kind != backend.KindMutex {
		return r.tryAcquireKind(ctx, l, ms)
	}
	if err := checkValue(l); err != nil {
		return false, 0, err
	}
	h, ok := l.Handle.(*handle)
	if !ok || h.key != l.Key || h.value != l.Value || h.ms != ms || h.waits != l.Waits {
		h = r.newHandle(l)
		l.Handle = h
	}
	var (
		v   int64
		err error
	)
	if r.waitReplicas > 0 {
		v, err = r.acquireWait(ctx, redisscript.Acquire, h.keys[:], h.acqCmd())
	} else {
		v, err = r.run(ctx, redisscript.Acquire, h.keys[:], h.acqCmd())
	}
	if err != nil {
		return false, 0, r.failed(ctx, fmt.Errorf("redis: acquire %q: %w", l.Key, err),
			func(ctx context.Context) error { return r.cleanup(ctx, h) })
	}
	acquired, token, holderTTL := redisscript.DecodeAcquire(v)
	if !acquired && !h.marked {
		// An acquisition that had to wait is likely to be waited for
		// too (a waiter may wait for the next notice without trying
		// against the holder: hotspot's WithYield): its next attempts
		// set the lock with the waited mark, so that its release sends
		// the notice.
		h.acq[5], h.marked = h.value+redisscript.WaitedMark, true
	}
	if acquired {
		// The attempts are over: nothing of the handle is needed while
		// the lock is held, and nothing refers to it but l (the request
		// returned).
		l.Token = token
		l.Handle = nil
		h.free()
	}
	return acquired, holderTTL, nil
}

// failed cleans up after an attempt that failed with err, with clean: at
// once while ctx lives, else (or when that fails) by returning an
// AbandonedError whose Cleanup does it. A request that was never sent
// (see notSent) needs none: err is returned as it is.
func (r *Resource) failed(ctx context.Context, err error, clean func(context.Context) error) error {
	if errors.Is(err, goredis.ErrClosed) || notSent(err) {
		// The client was closed, or the request never left it.
		return err
	}
	if ctx.Err() == nil {
		cerr := clean(ctx)
		if cerr == nil {
			return err
		}
		if errors.Is(cerr, goredis.ErrClosed) {
			// Nothing more can be sent: what the request set expires
			// with its TTL.
			return fmt.Errorf("%w (not cleaned up: %w)", err, cerr)
		}
	}
	if cerr := ctx.Err(); cerr != nil && !errors.Is(err, cerr) {
		err = fmt.Errorf("%w: %w", err, cerr)
	}
	return &backend.AbandonedError{Err: err, Cleanup: clean}
}

// notSent reports whether a request that failed with err never reached
// the wire: go-redis's last try could not dial (a refused connection, no
// route). go-redis tries a written request again only when its
// connection broke (the server, or a proxy before it, closed it), so a
// written try can precede a failed dial only when that server has since
// stopped taking connections: what the try set there lives at most its
// TTL, and no late copy of it can arrive on a connection that is gone.
func notSent(err error) bool {
	var op *net.OpError
	return errors.As(err, &op) && op.Op == "dial"
}

// acquireWait runs the acquire script s (cmd, a prebuilt EVALSHA with
// keys) and WAIT in one pipeline, so both go over one connection: WAIT
// counts acknowledgements of that connection's writes. On Cluster the
// pipeline goes to the key's master. A grant that too few replicas
// acknowledged is an error wrapping ErrNotReplicated. It returns when ctx
// ends, as run does.
func (r *Resource) acquireWait(ctx context.Context, s *goredis.Script, keys []string, cmd []any) (int64, error) {
	var v, acked int64
	var err error
	if !await(ctx, func() { v, acked, err = r.acquireWaitNow(ctx, s, keys, cmd[3+len(keys):]) }) {
		return 0, ctx.Err()
	}
	if err == nil && v > 0 && acked < int64(r.waitReplicas) {
		err = fmt.Errorf("%w: %d of %d replicas acknowledged", ErrNotReplicated, acked, r.waitReplicas)
	}
	return v, err
}

func (r *Resource) acquireWaitNow(ctx context.Context, s *goredis.Script, keys []string, args []any) (v, acked int64, err error) {
	var c goredis.Cmdable = r.c
	if r.cluster != nil {
		m, err := r.cluster.MasterForKey(ctx, keys[0])
		if err != nil {
			return 0, 0, err
		}
		c = m
	}
	v, acked, err = r.pipeWait(ctx, c, keys, args, s.EvalSha)
	if redisscript.NoScript(err) {
		v, acked, err = r.pipeWait(ctx, c, keys, args, s.Eval)
	}
	return v, acked, err
}

// pipeWait sends an acquire script (by run: EvalSha or Eval) and WAIT in
// one pipeline on c.
func (r *Resource) pipeWait(ctx context.Context, c goredis.Cmdable, keys []string, args []any,
	run func(context.Context, goredis.Scripter, []string, ...any) *goredis.Cmd) (v, acked int64, err error) {
	pipe := c.Pipeline()
	acq := run(ctx, pipe, keys, args...)
	wait := pipe.Do(ctx, "wait", r.waitReplicas, r.waitTimeout.Milliseconds())
	_, _ = pipe.Exec(ctx)
	if v, err = acq.Int64(); err != nil || v <= 0 {
		return v, 0, err
	}
	acked, err = wait.Int64()
	return v, acked, err
}

// cleanup deletes h's key if it still holds h's value, and writes the
// value's tombstone so that the acquire request, should it reach Redis
// only now, sets nothing (redisscript.Cleanup). One try: it gives up
// after cleanupTimeout, or when ctx ends.
func (r *Resource) cleanup(ctx context.Context, h *handle) error {
	if r.c == nil {
		return errNilClient
	}
	ctx, cancel := context.WithTimeout(ctx, cleanupTimeout)
	defer cancel()
	// Built here, not kept in the handle: clean-ups are rare.
	cmd := []any{"evalsha", cleanupSHA, 2, h.acq[3], h.acq[4], h.acq[5], h.acq[6], r.publish}
	_, err := r.run(ctx, redisscript.Cleanup, h.keys[:], cmd)
	return err
}

// Release implements [backend.RemoteResource] with one script call: delete
// the key if it holds l.Value and, when someone waits for it (an attempt
// was refused the lock: see Wake-up in the package doc), publish
// a release notice on the key's channel (SPUBLISH on Cluster). It returns [backend.ErrNotHeld] when the
// key expired or holds another value. It returns when ctx ends, with an
// error wrapping ctx's: the lock may then still be held (the request may
// also still reach the server and delete it), and Release may be called
// again.
//
// A Release that runs twice (go-redis sends a command again when the
// reply of the first run was lost to a read error, after that run deleted
// the key) returns nil the second time too: the release renames the key
// to prefix{k'}:released instead of deleting it (one command either way),
// which keeps the owner value for what was left of the lock's TTL, and a
// second run finds its value there. A lock that expired, or whose key
// someone else deleted, leaves no such trace: ErrNotHeld.
func (r *Resource) Release(ctx context.Context, l *backend.Lease) error {
	if r.c == nil {
		return errNilClient
	}
	if l.Kind != backend.KindMutex {
		return r.releaseKind(ctx, l)
	}
	flag := labelFlag
	if l.Label == "" {
		flag = noFlag
	}
	c := scriptCall(redisscript.Release, releaseSHA, r.lockKey(l), l.Value, r.publish, flag, traceFlag)
	n, _, err := r.send(ctx, c)
	if err != nil {
		return fmt.Errorf("redis: release %q: %w", l.Key, err)
	}
	if n == 0 {
		return backend.ErrNotHeld
	}
	return nil
}

// Refresh implements [backend.Refresher] with one script call: reset the
// key's expiry to l.TTL if it holds l.Value, and its fence's with it. It
// returns [backend.ErrNotHeld] when the key is gone or holds another
// value. It returns when ctx ends.
func (r *Resource) Refresh(ctx context.Context, l *backend.Lease) error {
	if r.c == nil {
		return errNilClient
	}
	if l.Kind != backend.KindMutex {
		return r.refreshKind(ctx, l)
	}
	flag := labelFlag
	if l.Label == "" {
		flag = noFlag
	}
	c := scriptCall(redisscript.Extend, extendSHA, r.lockKey(l), l.Value, r.boxMillis(redisscript.Millis(l.TTL)), flag, fenceFlag)
	n, _, err := r.send(ctx, c)
	if err != nil {
		return fmt.Errorf("redis: refresh %q: %w", l.Key, err)
	}
	if n == 0 {
		return backend.ErrNotHeld
	}
	return nil
}

// Subscribe implements [backend.Notifier]: ch receives a value when the
// lock on key is released through any Resource with the same prefix on the
// same deployment. The Resource keeps one subscription connection (on
// Cluster: one per master serving a subscribed key), subscribed to a key's
// channel only while someone in this process waits for it. Notices are
// hints; a lost subscription costs only latency. ch is nil after
// [Resource.Close], and always over a *goredis.Ring (its shards are
// independent servers, with no one place to subscribe).
func (r *Resource) Subscribe(key string) (<-chan struct{}, func()) {
	if r.hub == nil {
		return nil, func() {}
	}
	lock, _ := redisscript.Layout(r.prefix, key)
	return r.hub.subscribe(lock, "")
}

// SubscribeHead implements [backend.HeadNotifier]: ch receives the release
// notices of key addressed to the queued waiter value (its turn: the
// lock was kept for it, or a permit freed) and those addressed to every
// waiter, as [Resource.Subscribe] says; one addressed to value that came
// within the last second, before the subscription, at once.
func (r *Resource) SubscribeHead(key, value string) (<-chan struct{}, func()) {
	if r.hub == nil {
		return nil, func() {}
	}
	lock, _ := redisscript.Layout(r.prefix, key)
	return r.hub.subscribe(lock, value)
}

// Close stops the subscription goroutines, closes the subscription
// connections the Resource opened and stops its idle worker goroutines.
// It never closes the client given to [New]. The Resource stays usable for
// locks (later calls start goroutines as needed, which end with their
// request), without wake-up. Calls after the first do nothing and return
// nil.
func (r *Resource) Close() error {
	r.closeOnce.Do(func() { close(r.quit) })
	if r.hub == nil {
		return nil
	}
	return r.hub.close()
}
