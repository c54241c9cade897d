package redlock

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/distlock/distlock/backend"
	"github.com/distlock/distlock/internal/redisscript"
)

// DefaultPrefix is the key prefix used unless [WithPrefix] says otherwise.
// It is the Redis backend's, so a lock key is named alike on both.
const DefaultPrefix = redisscript.DefaultPrefix

// MaxKeyLen is the longest lock key, in bytes, that [Resource.ValidateKey]
// accepts: the Redis backend's limit.
const MaxKeyLen = redisscript.MaxKeyLen

// Defaults of the timing options.
const (
	// DefaultNodeTimeoutFactor times the TTL is the per-node timeout
	// unless [WithNodeTimeout] sets one.
	DefaultNodeTimeoutFactor = 0.05
	// MinNodeTimeout is the floor of the default per-node timeout.
	MinNodeTimeout = 5 * time.Millisecond
	// DefaultDriftFactor and DefaultDriftExtra make the default clock
	// drift allowance: ttl x 0.01 + 2ms.
	DefaultDriftFactor = 0.01
	DefaultDriftExtra  = 2 * time.Millisecond
)

// ErrNoQuorum is wrapped by the error of an operation that could not reach
// a majority of nodes: too many failed or did not answer within the
// per-node timeout. The error names the failed nodes and wraps their
// errors.
var ErrNoQuorum = errors.New("redlock: no quorum")

// ErrNoValidity is wrapped by the error of an acquire or refresh that
// reached a majority too late: no validity was left of the TTL after the
// elapsed time and the drift allowance. The lock was released again
// (acquire) or is left to expire (refresh).
var ErrNoValidity = errors.New("redlock: no validity left")

var (
	_ backend.Spinner      = (*Resource)(nil)
	_ backend.Refresher    = (*Resource)(nil)
	_ backend.KeyValidator = (*Resource)(nil)
	_ io.Closer            = (*Resource)(nil)
)

// Resource is a lock store over N independent Redis masters: a lock is held
// when a majority of them hold it. It is safe for concurrent use. Create it
// with [New]; pass it to distlock.New.
type Resource struct {
	nodes  []*node
	quorum int

	prefix      string
	nodeTimeout time.Duration // 0: DefaultNodeTimeoutFactor x TTL
	driftFactor float64
	driftExtra  time.Duration

	quit      chan struct{} // closed by Close: idle workers exit
	closeOnce sync.Once
}

// Option configures a [Resource]. A bad value makes [New] fail.
type Option func(*Resource) error

// WithPrefix sets the prefix of every key the Resource uses. The default is
// [DefaultPrefix] ("distlock:"). Keys are laid out as the Redis backend lays
// them out (the prefix, then the key in braces, both escaped), so the same
// prefix names the same key on both.
func WithPrefix(prefix string) Option {
	return func(r *Resource) error {
		r.prefix = prefix
		return nil
	}
}

// WithNodeTimeout sets how long an operation waits for each node's reply.
// The default, d == 0, is [DefaultNodeTimeoutFactor] x the lock's TTL, at
// least [MinNodeTimeout]. Either way the timeout is cut to the lock's
// validity (TTL minus drift): waiting longer could not give a lock. Keep it
// far below the TTL, so that a node that is down or paused costs little of
// the lock's validity. A negative d makes [New] fail.
func WithNodeTimeout(d time.Duration) Option {
	return func(r *Resource) error {
		if d < 0 {
			return fmt.Errorf("negative node timeout %v", d)
		}
		r.nodeTimeout = d
		return nil
	}
}

// WithDrift sets the clock drift allowance subtracted from the TTL:
// factor x TTL + extra. The default is [DefaultDriftFactor] (0.01) and
// [DefaultDriftExtra] (2ms). It accounts for node clocks running at
// different rates, not for clocks being set: see the package doc. A factor
// outside [0, 1) or a negative extra makes [New] fail.
func WithDrift(factor float64, extra time.Duration) Option {
	return func(r *Resource) error {
		if !(factor >= 0 && factor < 1) || extra < 0 {
			return fmt.Errorf("bad drift %v x TTL + %v", factor, extra)
		}
		r.driftFactor, r.driftExtra = factor, extra
		return nil
	}
}

// New returns a Resource over nodes, which must be independent Redis
// masters (not replicas of each other, not one Cluster): an odd number of
// them, at least 3, none nil. The caller owns the clients: the Resource
// never closes them. Each client is best created with
// ContextTimeoutEnabled: true, so that go-redis gives up a node's socket
// I/O at the per-node timeout; without it the Resource still stops waiting
// at the timeout, and the abandoned request finishes in the background
// within the client's ReadTimeout.
//
// New does no I/O. It returns an error wrapping [backend.ErrInvalid]
// (distlock.ErrInvalid) for an even, short or nil-holding node list and
// for a bad option.
func New(nodes []goredis.UniversalClient, opts ...Option) (*Resource, error) {
	switch n := len(nodes); {
	case n < 3:
		return nil, fmt.Errorf("redlock: New: %w: %d nodes; need an odd number, at least 3", backend.ErrInvalid, n)
	case n%2 == 0:
		return nil, fmt.Errorf("redlock: New: %w: %d nodes; need an odd number (an even one adds a node but no failure tolerance)", backend.ErrInvalid, n)
	}
	r := &Resource{
		quorum:      len(nodes)/2 + 1,
		prefix:      DefaultPrefix,
		driftFactor: DefaultDriftFactor,
		driftExtra:  DefaultDriftExtra,
		quit:        make(chan struct{}),
	}
	for _, o := range opts {
		if o == nil {
			return nil, fmt.Errorf("redlock: New: %w: nil option", backend.ErrInvalid)
		}
		if err := o(r); err != nil {
			return nil, fmt.Errorf("redlock: New: %w: %w", backend.ErrInvalid, err)
		}
	}
	r.nodes = make([]*node, len(nodes))
	for i, c := range nodes {
		if isNil(c) {
			return nil, fmt.Errorf("redlock: New: %w: node %d is nil", backend.ErrInvalid, i)
		}
		r.nodes[i] = &node{c: c, name: nodeName(i, c), tasks: make(chan task), quit: r.quit}
	}
	return r, nil
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

// nodeName names node i in errors: its index and, when known, its address.
func nodeName(i int, c goredis.UniversalClient) string {
	var addr string
	switch c := c.(type) {
	case *goredis.Client:
		addr = c.Options().Addr
	case *goredis.ClusterClient:
		addr = strings.Join(c.Options().Addrs, ",")
	}
	if addr == "" {
		return fmt.Sprintf("node %d", i)
	}
	return fmt.Sprintf("node %d (%s)", i, addr)
}

// Quorum returns the number of nodes that must agree: N/2 + 1.
func (r *Resource) Quorum() int { return r.quorum }

// drift is the clock drift allowance for ttl.
func (r *Resource) drift(ttl time.Duration) time.Duration {
	return time.Duration(float64(ttl)*r.driftFactor) + r.driftExtra
}

// timeout is the per-node timeout for ttl, cut to the validity.
func (r *Resource) timeout(ttl, validity time.Duration) time.Duration {
	d := r.nodeTimeout
	if d == 0 {
		d = max(time.Duration(float64(ttl)*DefaultNodeTimeoutFactor), MinNodeTimeout)
	}
	return min(d, validity)
}

// handle is the per-round state kept in backend.Lease.Handle: the key
// name, the value the round stores and the command arguments, built once
// per acquire round and shared, read only, by every node's request of the
// round, and of the refreshes and the release of the round that got the
// lock; and that round.
//
// Each round of an acquisition stores a value of its own (see
// [roundValue]), so a handle is never changed once built: the late
// requests of an earlier round, still running on the nodes' workers, keep
// the arguments of their own round.
type handle struct {
	key, value string // the lease's Key and Value
	round      uint64 // 1 for the acquisition's first round, then 2, 3...
	ms         int64
	keys       [1]string // the lock key, for EVAL after NOSCRIPT
	labeled    bool      // the nodes keep a label key beside the lock

	// The commands, in the handle (one allocation per round); acquireCmd
	// and releaseCmd slice off the label arguments of an unlabelled lock.
	acquire [7]any // EVALSHA acquire 1 lock stored ms [label]
	cleanup [6]any
	release [7]any // EVALSHA release 1 lock stored ["" "1": and the label key]

	// acq is the acquire round that got the lock, set by TryAcquire on
	// success and read by Release: the release round settles with it
	// which keys set late must be deleted once more.
	acq *round
}

// roundValue is what round n of the acquisition with owner value v
// stores on the nodes: v, '#', n in decimal. Distinct (v, n) give
// distinct values (n has no '#', so the last '#' splits them), and owner
// values are unique across acquisitions: no round counts, extends or
// deletes another round's key.
func roundValue(v string, n uint64) string {
	return v + "#" + strconv.FormatUint(n, 10)
}

// testHookAfterWait, when set by a test, runs between an acquire round's
// wait and its decision: it stands for the caller being paused there.
var testHookAfterWait func()

// The scripts' SHA1 digests, boxed once.
var (
	acquireSHA any = redisscript.AcquireQuiet.Hash()
	extendSHA  any = redisscript.Extend.Hash()
	releaseSHA any = redisscript.Release.Hash()
	cleanupSHA any = redisscript.Cleanup.Hash()
)

// newHandle builds the handle of round n of l's acquisition, with a TTL
// of ms. It takes the lock key, boxed and not, and the boxed TTL from
// prev, the previous round's handle, when it has them.
func (r *Resource) newHandle(l *backend.Lease, ms int64, n uint64, prev *handle) *handle {
	h := &handle{key: l.Key, value: l.Value, round: n, ms: ms, labeled: l.Label != ""}
	var lock, px any
	if prev != nil && prev.key == l.Key && prev.ms == ms {
		h.keys[0], lock, px = prev.keys[0], prev.acquire[3], prev.acquire[5]
	} else {
		h.keys[0], _ = redisscript.Layout(r.prefix, l.Key)
		lock, px = h.keys[0], ms
	}
	var stored any = roundValue(l.Value, n)
	h.cleanup = [6]any{"evalsha", cleanupSHA, 1, lock, stored, px}
	// With a label, the label key (redisscript.LabelSuffix) goes with the
	// lock on each node, for Inspect.
	h.acquire = [7]any{"evalsha", acquireSHA, 1, lock, stored, px, l.Label}
	h.release = [7]any{"evalsha", releaseSHA, 1, lock, stored, "", "1"}
	return h
}

// acquireCmd returns the acquire command.
func (h *handle) acquireCmd() []any {
	if h.labeled {
		return h.acquire[:]
	}
	return h.acquire[:6]
}

// releaseCmd returns the release command.
func (h *handle) releaseCmd() []any {
	if h.labeled {
		return h.release[:]
	}
	return h.release[:5]
}

// handleOf returns the lease's handle: that of the round that got the
// lock. When the lease has none of ours it returns one (not stored: the
// lease may be in use by another goroutine) of a round 0 that no
// TryAcquire makes, whose value no node holds.
func (r *Resource) handleOf(l *backend.Lease) *handle {
	ms := redisscript.Millis(l.TTL)
	h, ok := l.Handle.(*handle)
	if !ok || h.key != l.Key || h.value != l.Value {
		return r.newHandle(l, ms, 0, nil)
	}
	if h.ms != ms { // l.TTL changed since the acquisition: same round, new TTL
		c := r.newHandle(l, ms, h.round, h)
		c.acq = h.acq
		return c
	}
	return h
}

// ValidateKey implements [backend.KeyValidator]: it rejects an empty key and
// one longer than [MaxKeyLen] bytes. Any bytes are allowed, braces included.
func (r *Resource) ValidateKey(key string) error {
	return redisscript.ValidateKey("redlock", key)
}

// TryAcquire implements [backend.Spinner] with one quorum round: the
// acquire script (SET lock value NX PX ttl) is sent to every node at once,
// with a value of the round's own: l.Value, '#', and the number of the
// round among the calls with this lease (see the package doc). Release
// and Refresh use the value of the round that got the lock.
// The round ends as soon as [Resource.Quorum] nodes set the key, else when
// every node answered or the per-node timeout passed. The lock is held
// when at least a majority set it and the time elapsed since the round
// started is less than the TTL minus the drift allowance; nodes still
// answering then set the key for us in the background, and Release
// deletes it there too. l.Validity is then TTL - drift, counted from the start of the
// round as [backend.Lease] says (so ttl - elapsed - drift is left when
// TryAcquire returns), l.TTL is the TTL rounded up to whole milliseconds,
// and l.Token stays 0: Redlock makes no fencing tokens.
//
// Otherwise the key is deleted (compare-and-delete) on every node, those
// that timed out or failed included (unless no node could be dialled:
// nothing was sent), and TryAcquire returns:
//   - false and a nil error when other owners hold it on enough nodes that
//     a majority answered but too few said yes; holderTTL is then the time
//     until enough of their keys expire for a majority to be free (0 when
//     a node did not say). It returns once the nodes that said yes have
//     deleted the key; the other deletes finish in the background (when
//     those of the nodes that said yes do not come back in time, the
//     error is an AbandonedError, as below);
//   - an error wrapping [ErrNoQuorum], naming the failed nodes, when fewer
//     than a majority answered (a node that did not answer within the
//     per-node timeout wraps context.DeadlineExceeded);
//   - an error wrapping [ErrNoValidity] when a majority said yes too late;
//   - an error wrapping ctx.Err() when ctx ended before the round was
//     decided, even if a majority had said yes.
//
// TryAcquire returns when ctx ends, whatever the nodes do. The deletes of
// a failed round are waited for while ctx lives and every node answered
// the round. Otherwise (ctx ended, a node did not answer, or a delete
// did not come back), the error is a *[backend.AbandonedError] whose
// Cleanup waits for the deletes, and sends them again to the nodes that
// have not confirmed, until every node that may hold the key (it said it
// set it, or its reply did not come or did not tell, in a contended round
// too) has: the facade runs it in the background. A caller of TryAcquire
// outside the facade must call it likewise. The deletes of a round whose
// request may still be on its way to a node (a node did not answer, or
// ctx ended) also leave a tombstone of the round's value for one TTL, so
// that the request sets nothing when it arrives.
//
// A TTL that would leave less than [MinNodeTimeout] of validity after the
// drift allowance is rounded up until it leaves that much (about 8ms with
// the default drift), and l.TTL says so.
func (r *Resource) TryAcquire(ctx context.Context, l *backend.Lease) (bool, time.Duration, error) {
	ms := redisscript.Millis(l.TTL)
	ttl := time.Duration(ms) * time.Millisecond
	// A TTL too short to leave a validity of one node timeout after the
	// drift allowance is rounded up to the shortest that does, as every
	// store rounds a TTL below its floor up.
	for i := 0; ttl-r.drift(ttl) < MinNodeTimeout && i < 1000; i++ {
		ms++
		ttl += time.Millisecond
	}
	validity := ttl - r.drift(ttl)
	if validity <= 0 {
		return false, 0, fmt.Errorf("redlock: acquire %q: TTL %v is not longer than the drift allowance %v", l.Key, ttl, r.drift(ttl))
	}
	if err := ctx.Err(); err != nil {
		return false, 0, fmt.Errorf("redlock: acquire %q: %w", l.Key, err)
	}
	l.TTL = ttl
	// Every round stores a value of its own: a node that says yes then
	// set the key for this round's request, sent after start, and the
	// late requests of an earlier round (a SET, a clean-up) can neither
	// count as this round's yes nor delete this round's key.
	n := uint64(1)
	prev, _ := l.Handle.(*handle)
	if prev != nil && prev.key == l.Key && prev.value == l.Value {
		n = prev.round + 1
	}
	h := r.newHandle(l, ms, n, prev)
	l.Handle = h
	start := time.Now()
	timeout := r.timeout(ttl, validity)
	rd := r.start(ctx, opAcquire, h, h.acquireCmd(), timeout, r.quorum, nil, nil, time.Time{})
	rd.wait()
	if testHookAfterWait != nil {
		testHookAfterWait()
	}
	// Decided under the round's lock: later replies are late.
	rd.mu.Lock()
	rd.over = true
	var yes, no, unanswered int
	for _, rep := range rd.res {
		switch {
		case rep.err != nil:
			unanswered++
		case rep.v > 0:
			yes++
		default:
			no++
		}
	}
	elapsed := time.Since(start)
	// A caller that gave up does not get the lock, even from a majority.
	held := yes >= r.quorum && elapsed < validity && ctx.Err() == nil
	rd.mu.Unlock()
	if held {
		h.acq = rd
		l.Validity = validity
		return true, 0, nil
	}

	// Contention (a majority answered, too few said yes) is no error: the
	// spin loop tries again, with a round of its own. The round's value
	// is never used again whatever the outcome, so its cleanup may bury
	// it: it does when a request may still be on its way, because a node
	// did not answer (its request can reach it after the cleanup and set
	// the key until its TTL). A contended round whose every node answered
	// has nothing on its way, and writes no tombstones: a crowd of
	// waiters spinning on a held lock would otherwise leave one per round
	// and node, each living a TTL.
	ctxErr := ctx.Err()
	if ctxErr == nil && unsent(rd.res) {
		// No node could be dialled: nothing was sent, nothing to clean.
		return false, 0, rd.noQuorum("acquire", l.Key, r.quorum)
	}
	contended := ctxErr == nil && yes < r.quorum && yes+no >= r.quorum
	cl := r.cleanUp(rd, timeout, !contended || unanswered > 0, contended, start.Add(ttl))
	var err error
	switch {
	case ctxErr != nil:
		err = fmt.Errorf("redlock: acquire %q: %w", l.Key, ctxErr)
	case yes >= r.quorum:
		err = fmt.Errorf("redlock: acquire %q: %w: %d of %d nodes set it in %v; the TTL %v minus drift leaves %v",
			l.Key, ErrNoValidity, yes, len(r.nodes), elapsed, ttl, validity)
	case contended:
		// Only the nodes that set our key hold anyone up: wait for
		// their deletes (the others' finish in the background). When
		// they do not come back, the Cleanup of the abandoned round
		// waits for those of the nodes that did not answer too.
		if cerr := cl.settle(ctx, true); cerr != nil {
			err = fmt.Errorf("redlock: acquire %q: not acquired; %w", l.Key, cerr)
			break
		}
		return false, holderTTL(rd.res, r.quorum-yes), nil
	default:
		err = rd.noQuorum("acquire", l.Key, r.quorum)
	}
	// The round failed. Its cleanup is made here while ctx lives and
	// every node answered the round (a node that did not would most
	// likely leave the cleanup waiting as long again); otherwise, or when
	// it could not be made, the caller's background makes it.
	if ctxErr == nil && !contended && !rd.anyPending() {
		cerr := cl.try(ctx)
		if cerr == nil {
			return false, 0, err
		}
		err = fmt.Errorf("%w; %w", err, cerr)
	}
	if cerr := ctx.Err(); cerr != nil && !errors.Is(err, cerr) {
		err = fmt.Errorf("%w: %w", err, cerr)
	}
	return false, 0, &backend.AbandonedError{Err: err, Cleanup: cl.try}
}

// cleaner deletes the key of a failed acquire round on every node, with
// rounds of its own: the first is sent when it is made, and [cleaner.try]
// waits for it, then sends another round while a node that must confirm
// its delete has not. With bury, each delete also writes the round's
// value's tombstone on the node (redisscript.Cleanup), for a round whose
// request may still be on its way to a node: it then sets nothing there
// when it arrives.
//
// Every node gets the first round, those that refused the key included:
// a request go-redis retried after a lost reply may have been applied
// after its retry said "held". The nodes that must confirm it, for
// [cleaner.try] to succeed, are those that said they set the key and
// those whose reply did not come or did not say what happened (a
// timeout, a broken connection): their request may land after the
// cleanup was sent, and only a delete that ran on the node, with the
// tombstone (bury, which the round then has), rules out that it sets the
// key after try returned nil. A node that answered no, or refused the
// script with an error reply, or could not even be dialled, set nothing.
// A contended round waits only for the nodes that set the key
// ([cleaner.settle]); the deletes of the others are sent all the same.
type cleaner struct {
	r       *Resource
	acq     *round
	o       op
	args    []any
	timeout time.Duration // of the next round

	mu   sync.Mutex
	rd   *round // the round in flight, nil when none
	need []bool // nodes that have not confirmed their delete
	set  []bool // nodes that said they set the key
}

// cleanUp makes the cleaner of the decided acquire round acq, and sends its
// first round, with the round's per-node timeout. With contended, the
// first round's wait ends once the nodes that set the key answered.
func (r *Resource) cleanUp(acq *round, timeout time.Duration, bury, contended bool, expires time.Time) *cleaner {
	n := len(acq.res)
	nodes := make([]bool, 2*n)
	c := &cleaner{r: r, acq: acq, o: opRelease, args: acq.h.releaseCmd(), timeout: timeout,
		need: nodes[:n:n], set: nodes[n:]}
	if bury {
		c.o, c.args = opCleanup, acq.h.cleanup[:]
	}
	for i, rep := range acq.res {
		if rep.err == nil {
			c.set[i] = rep.v > 0
			c.need[i] = c.set[i]
		} else {
			c.need[i] = !settled(rep.err)
		}
	}
	want := c.need
	var until time.Time
	if contended {
		want = c.set
		until = expires
	}
	c.rd = r.start(context.Background(), c.o, acq.h, c.args, timeout, 0, acq, slices.Clone(want), until)
	return c
}

// settled reports whether a request that failed with err certainly set
// nothing: the server refused it, or it was never sent.
func settled(err error) bool {
	var rerr goredis.Error
	var oerr *net.OpError
	return errors.As(err, &rerr) || errors.Is(err, goredis.ErrClosed) ||
		(errors.As(err, &oerr) && oerr.Op == "dial")
}

// unsent reports whether every node's request failed without being sent:
// its last try could not dial (see redis's notSent: an earlier try that
// was written can precede it only when that node has since stopped
// taking connections).
func unsent(res []reply) bool {
	for _, rep := range res {
		var oerr *net.OpError
		if !errors.As(rep.err, &oerr) || oerr.Op != "dial" {
			return false
		}
	}
	return true
}

// try waits for the round in flight (sending a new one to the nodes that
// still must confirm when there is none) until it ends or ctx does. It
// returns nil when every node that must confirm its delete has, else an
// error naming the others. It is the Cleanup of the AbandonedError of a
// failed acquire, which the facade calls until it returns nil.
func (c *cleaner) try(ctx context.Context) error { return c.settle(ctx, false) }

// settle is try; with setOnly, it returns nil once the nodes that set the
// key confirmed their delete, whatever the others did: a contended
// round's wait.
func (c *cleaner) settle(ctx context.Context, setOnly bool) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.rd == nil {
		if !slices.Contains(c.need, true) {
			return nil
		}
		c.timeout = max(c.timeout, lateCleanupTimeout)
		c.rd = c.r.start(context.Background(), c.o, c.acq.h, c.args, c.timeout, 0, c.acq, slices.Clone(c.need), time.Time{})
	}
	rd := c.rd
	rd.waitCtx(ctx)
	var errs []error
	rd.mu.Lock()
	// The round is over when its timeout passed or every node that must
	// confirm answered (the first round of a contended one ends its wait
	// sooner: it may still be waiting for the others).
	over := rd.ctx.Err() != nil
	if !over {
		over = true
		for i, rep := range rd.res {
			if c.need[i] && rep.err == errPending {
				over = false
			}
		}
	}
	for i, rep := range rd.res {
		if !c.need[i] {
			continue
		}
		switch {
		case rep.err == nil:
			c.need[i] = false
		case setOnly && !c.set[i]:
			// Not waited for: its delete finishes in the background.
		case rep.err == errPending && over:
			errs = append(errs, fmt.Errorf("%s kept the key: no reply within %v: %w", c.r.nodes[i].name, rd.timeout, context.DeadlineExceeded))
		case rep.err == errPending:
			errs = append(errs, fmt.Errorf("%s kept the key: no reply yet: %w", c.r.nodes[i].name, ctx.Err()))
		default:
			errs = append(errs, fmt.Errorf("%s kept the key: %w", c.r.nodes[i].name, rep.err))
		}
	}
	rd.mu.Unlock()
	if over {
		c.rd = nil
	}
	if len(errs) > 0 {
		return fmt.Errorf("clean up: %w", joined(errs))
	}
	return nil
}

// holderTTL returns the time until need more nodes are free: the need-th
// smallest remaining TTL among the nodes held by others, or 0 when fewer
// than need of them told it.
func holderTTL(res []reply, need int) time.Duration {
	var buf [maxInline]int64
	ttls := buf[:0]
	for _, rep := range res {
		if rep.err == nil && rep.v < 0 {
			ttls = append(ttls, -rep.v)
		}
	}
	if need <= 0 || len(ttls) < need {
		return 0
	}
	for i := 1; i < len(ttls); i++ { // insertion sort: N is small
		for j := i; j > 0 && ttls[j] < ttls[j-1]; j-- {
			ttls[j], ttls[j-1] = ttls[j-1], ttls[j]
		}
	}
	return time.Duration(ttls[need-1]) * time.Millisecond
}

// Release implements [backend.RemoteResource]: compare-and-delete on every
// node at once. It returns nil as soon as a majority of nodes deleted our
// value (the other nodes' deletes finish in the background, within the
// per-node timeout); otherwise, once every node answered or the per-node
// timeout passed, an error
// wrapping [backend.ErrNotHeld] when fewer than a majority could still have
// held it (even counting the nodes that failed), and otherwise an error
// wrapping [ErrNoQuorum] naming the failed nodes: the lock may then still
// be held, and expires with its TTL.
func (r *Resource) Release(ctx context.Context, l *backend.Lease) error {
	h := r.handleOf(l)
	ttl := time.Duration(h.ms) * time.Millisecond
	rd := r.start(ctx, opRelease, h, h.releaseCmd(), r.timeout(ttl, ttl), r.quorum, h.acq, nil, time.Time{})
	rd.wait()
	deleted, failed := rd.decide()
	switch {
	case deleted >= r.quorum:
		return nil
	case deleted+failed < r.quorum:
		return fmt.Errorf("redlock: release %q: %w: %d of %d nodes held it", l.Key, backend.ErrNotHeld, deleted, len(r.nodes))
	case ctx.Err() != nil:
		return fmt.Errorf("redlock: release %q: %w", l.Key, ctx.Err())
	}
	return rd.noQuorum("release", l.Key, r.quorum)
}

// Refresh implements [backend.Refresher]: compare-and-PEXPIRE to l.TTL on
// every node at once. It succeeds as soon as a majority extended our
// value, if the time elapsed is less than the TTL minus the drift
// allowance, so the lock is valid for TTL - drift from the start of the
// call, as after an acquire. It returns an error wrapping
// [backend.ErrNotHeld] when fewer than a majority could still hold our
// value, [ErrNoValidity] when the majority answered too late, and
// [ErrNoQuorum] naming the failed nodes when too few answered. It does
// not set the key again on a node that lost it (one restarted empty).
func (r *Resource) Refresh(ctx context.Context, l *backend.Lease) error {
	h := r.handleOf(l)
	ttl := time.Duration(h.ms) * time.Millisecond
	validity := ttl - r.drift(ttl)
	if validity <= 0 {
		return fmt.Errorf("redlock: refresh %q: TTL %v is not longer than the drift allowance %v", l.Key, ttl, r.drift(ttl))
	}
	start := time.Now()
	// Built per call, not kept in the handle: refreshes are rare (every
	// TTL/3 at most), acquisitions are not.
	args := []any{"evalsha", extendSHA, 1, h.acquire[3], h.acquire[4], h.acquire[5], "1"}
	if !h.labeled {
		args = args[:6]
	}
	rd := r.start(ctx, opExtend, h, args, r.timeout(ttl, validity), r.quorum, nil, nil, time.Time{})
	rd.wait()
	extended, failed := rd.decide()
	elapsed := time.Since(start)
	switch {
	case extended >= r.quorum && elapsed < validity:
		return nil
	case extended >= r.quorum:
		return fmt.Errorf("redlock: refresh %q: %w: %d of %d nodes extended it in %v; the TTL %v minus drift leaves %v",
			l.Key, ErrNoValidity, extended, len(r.nodes), elapsed, ttl, validity)
	case extended+failed < r.quorum:
		return fmt.Errorf("redlock: refresh %q: %w: %d of %d nodes held it", l.Key, backend.ErrNotHeld, extended, len(r.nodes))
	case ctx.Err() != nil:
		return fmt.Errorf("redlock: refresh %q: %w", l.Key, ctx.Err())
	}
	return rd.noQuorum("refresh", l.Key, r.quorum)
}

// Close stops the Resource's idle worker goroutines. It never closes the
// clients given to [New]. The Resource stays usable: later calls start
// goroutines as needed, which end with their request. Calls after the
// first do nothing and return nil.
func (r *Resource) Close() error {
	r.closeOnce.Do(func() { close(r.quit) })
	return nil
}
