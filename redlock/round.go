package redlock

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/distlock/distlock/internal/redisscript"
)

// maxInline is the node count up to which a round keeps its replies
// inline, with no allocation of their own.
const maxInline = 7

// idleTimeout is how long a node's worker goroutine waits for the next
// request before it exits.
const idleTimeout = 2 * time.Second

// lateCleanupTimeout bounds the compare-and-delete a worker sends when an
// acquire request answered "set" after its round had given up the lock.
const lateCleanupTimeout = time.Second

type op uint8

const (
	opAcquire op = iota
	opExtend
	opRelease
	opCleanup // a release that also writes the value's tombstone
)

// script returns op's script, for EVAL when a node does not have it
// cached.
func (o op) script() *goredis.Script {
	switch o {
	case opAcquire:
		return redisscript.AcquireQuiet
	case opExtend:
		return redisscript.Extend
	case opCleanup:
		return redisscript.Cleanup
	}
	return redisscript.Release
}

// reply is one node's answer in a round: the script's reply v when err is
// nil; err is errPending until the node answers.
type reply struct {
	v   int64
	err error
}

// errPending marks a reply not received (yet, or before the decision).
var errPending = errors.New("redlock: no reply")

// Per-node state of an acquire round, kept under its mu, that decides
// whether a key set by the round must be deleted once more. The race it
// settles: the acquire request and a later delete (a release, or the
// cleanup of a failed round) travel on different connections, and a
// request that was slow to answer may have been applied after the delete.
const (
	nodeSetLate uint8 = 1 << iota // the node said it set our key after a delete was sent
	nodeDelDone                   // a delete of this round's key answered
	nodeDeleted                   // ... and deleted our value
)

// round is one request sent to every node at once. The caller starts it
// and waits until the outcome is known: a majority said yes (early), every
// node answered, the per-node timeout passed or the caller's context
// ended. It then decides under mu, setting over; replies after that are
// late and not recorded.
//
// The requests run under a context detached from the caller's
// cancellation, bounded by the per-node timeout: a caller that stops
// waiting does not cut a request whose reply tells whether the key was
// set, nor the stragglers of a release decided by a majority. The last
// request to finish releases that context's timer.
//
// A delete round (release or cleanup) of an acquire round acq records its
// replies in acq's node state. Whichever of the two replies on a node
// comes second sees whether our key was set after the delete ran there
// (the set answered after the delete was sent, and the delete found
// nothing or failed): then it deletes the key once more.
type round struct {
	nodes   []*node
	h       *handle
	args    []any // the command, shared read-only by every node's request
	timeout time.Duration
	acq     *round // for a delete round: the acquire round it undoes
	want    []bool // nodes whose replies end the wait; nil: every node
	early   int32  // > 0: end the wait once this many nodes said yes
	op      op
	// until, for the delete round of a contended acquire round, is when
	// the acquire round's key expires: a node that did not answer the
	// acquire round, and whose delete fails without saying what happened,
	// is sent the delete again until it answers or until then (see
	// [round.persist]).
	until time.Time

	ctx    context.Context    // the requests'
	cancel context.CancelFunc // of ctx; called by the last request
	caller <-chan struct{}    // the caller's ctx.Done()
	done   chan struct{}      // closed when the wait can end

	mu       sync.Mutex
	over     bool  // decided: later replies are late
	ended    bool  // done is closed
	deleting bool  // acquire round: a delete round has been sent
	left     int32 // replies (of nodes in want) still expected before the decision
	pending  int32 // requests not finished, late ones included
	yes      int32
	res      []reply
	state    []uint8 // acquire round: node state
	resBuf   [maxInline]reply
	stateBuf [maxInline]uint8
}

// start sends args to every node at once, each with a timeout from now.
// early > 0 ends the wait as soon as that many nodes said yes (v > 0).
// acq, for a delete round, is the acquire round whose key it deletes.
// want, when not nil, names the nodes whose replies end the wait (the
// others' requests are sent all the same). until, for a delete round, is
// when acq's key expires if the round must persist (see round.until); zero
// otherwise.
func (r *Resource) start(ctx context.Context, o op, h *handle, args []any, timeout time.Duration, early int, acq *round, want []bool, until time.Time) *round {
	rd := &round{nodes: r.nodes, op: o, h: h, args: args, timeout: timeout, early: int32(early), acq: acq, want: want, until: until, done: make(chan struct{})}
	rctx := ctx
	if rd.caller = ctx.Done(); rd.caller != nil {
		rctx = context.WithoutCancel(ctx)
	}
	rd.ctx, rd.cancel = context.WithTimeout(rctx, timeout)
	if n := len(r.nodes); n <= maxInline {
		rd.res = rd.resBuf[:n]
		if o == opAcquire {
			rd.state = rd.stateBuf[:n]
		}
	} else {
		rd.res = make([]reply, n)
		if o == opAcquire {
			rd.state = make([]uint8, n)
		}
	}
	for i := range rd.res {
		rd.res[i].err = errPending
	}
	rd.left = int32(len(r.nodes))
	if want != nil {
		rd.left = 0
		for _, w := range want {
			if w {
				rd.left++
			}
		}
	}
	if rd.left == 0 {
		rd.ended = true
		close(rd.done)
	}
	rd.pending = int32(len(r.nodes))
	if acq != nil {
		acq.mu.Lock()
		acq.deleting = true
		acq.mu.Unlock()
	}
	for i, nd := range r.nodes {
		nd.submit(task{rd: rd, i: i})
	}
	return rd
}

// wait returns when the outcome is known, the per-node timeout passed or
// the caller's context ended.
func (rd *round) wait() {
	select {
	case <-rd.done:
	case <-rd.ctx.Done():
	case <-rd.caller:
	}
}

// waitCtx is wait with ctx for the caller's context: a round started by
// one caller and waited for by another.
func (rd *round) waitCtx(ctx context.Context) {
	select {
	case <-rd.done:
	case <-rd.ctx.Done():
	case <-ctx.Done():
	}
}

// decide ends a release or extend round: ok counts the nodes that
// answered 1 (done), failed those that erred or did not answer in time.
func (rd *round) decide() (ok, failed int) {
	rd.mu.Lock()
	rd.over = true
	for _, rep := range rd.res {
		switch {
		case rep.err != nil:
			failed++
		case rep.v > 0:
			ok++
		}
	}
	rd.mu.Unlock()
	return ok, failed
}

// noQuorum is the error of a decided round that fewer than quorum nodes
// answered: it names each failed node with its error.
func (rd *round) noQuorum(op, key string, quorum int) error {
	var errs []error
	for i, rep := range rd.res {
		switch {
		case rep.err == errPending:
			errs = append(errs, fmt.Errorf("%s: no reply within %v: %w", rd.nodes[i].name, rd.timeout, context.DeadlineExceeded))
		case rep.err != nil:
			errs = append(errs, fmt.Errorf("%s: %w", rd.nodes[i].name, rep.err))
		}
	}
	return fmt.Errorf("redlock: %s %q: %w: %d of %d nodes failed, %d must answer: %w",
		op, key, ErrNoQuorum, len(errs), len(rd.nodes), quorum, joined(errs))
}

// joined is errors.Join on one line: the errors' texts separated by "; ".
type joined []error

func (j joined) Error() string {
	var b strings.Builder
	for i, err := range j {
		if i > 0 {
			b.WriteString("; ")
		}
		b.WriteString(err.Error())
	}
	return b.String()
}

// Unwrap returns the errors, for errors.Is and errors.As.
func (j joined) Unwrap() []error { return j }

// run sends the round's request to node i and records the reply.
func (rd *round) run(i int) {
	nd := rd.nodes[i]
	v, err := nd.eval(rd.ctx, rd.op, rd.args, rd.h)
	if err != nil && !rd.until.IsZero() {
		v, err = rd.persist(i, err)
	}
	yes := err == nil && v > 0
	again := false
	rd.mu.Lock()
	if !rd.over {
		rd.res[i] = reply{v: v, err: err}
		if rd.want == nil || rd.want[i] {
			rd.left--
		}
		if yes {
			rd.yes++
		}
		if !rd.ended && (rd.left == 0 || (rd.early > 0 && rd.yes >= rd.early)) {
			rd.ended = true
			close(rd.done)
		}
	}
	if rd.op == opAcquire && yes && rd.deleting {
		st := rd.state[i] | nodeSetLate
		again = st&nodeDelDone != 0 && st&nodeDeleted == 0
		rd.state[i] = st
	}
	rd.pending--
	last := rd.pending == 0
	rd.mu.Unlock()
	if a := rd.acq; a != nil {
		a.mu.Lock()
		st := a.state[i] | nodeDelDone
		if yes {
			st |= nodeDeleted
		} else {
			st &^= nodeDeleted
		}
		a.state[i] = st
		again = !yes && st&nodeSetLate != 0
		a.mu.Unlock()
	}
	if again {
		// Our key was set on this node after a delete found nothing
		// there: delete it rather than let it linger until its TTL.
		ctx, cancel := context.WithTimeout(context.WithoutCancel(rd.ctx), lateCleanupTimeout)
		_, _ = nd.eval(ctx, opRelease, rd.h.releaseCmd(), rd.h)
		cancel()
	}
	if last {
		rd.cancel()
	}
}

// persist sends a contended round's delete to node i again, after its
// first failed with err, while the node may hold the round's key: it did
// not answer the acquire round (its request may land later, or may have
// landed), err does not say the delete was refused or never sent
// (settled), and the key has not expired (until). Nobody else would: a
// contended round returns no error, so no Cleanup of the facade's comes
// after it, and without this the key could stay on the node until its TTL,
// keeping it from every other owner. The tries are spaced by the round's
// per-node timeout and stop at Close (the key then expires with its TTL).
// It returns the last reply.
func (rd *round) persist(i int, err error) (int64, error) {
	a := rd.acq
	a.mu.Lock()
	unanswered := a.res[i].err != nil
	a.mu.Unlock()
	nd := rd.nodes[i]
	var v int64
	for err != nil && unanswered && !settled(err) && time.Until(rd.until) > 0 {
		pause := time.NewTimer(rd.timeout)
		select {
		case <-pause.C:
		case <-nd.quit:
			pause.Stop()
			return v, err
		}
		ctx, cancel := context.WithTimeout(context.WithoutCancel(rd.ctx), min(max(rd.timeout, lateCleanupTimeout), time.Until(rd.until)))
		v, err = nd.eval(ctx, rd.op, rd.args, rd.h)
		cancel()
	}
	return v, err
}

// node is one Redis master and its worker goroutines.
type node struct {
	c    goredis.UniversalClient
	name string // for errors: "node 2 (127.0.0.1:6380)"
	// tasks hands a request to an idle worker; unbuffered, so a send
	// succeeds only when one is waiting.
	tasks chan task
	quit  <-chan struct{}
	// workers counts the running worker goroutines (for tests; changed
	// only when one starts or exits).
	workers atomic.Int32
}

// task is node i's part of a round.
type task struct {
	rd *round
	i  int
}

// submit runs t on an idle worker of the node, or on a new one. Workers
// stay idle for idleTimeout, so a steady load reuses them and a round
// costs no goroutine allocation, while a burst of concurrent rounds gets
// as many workers as it needs.
func (nd *node) submit(t task) {
	select {
	case nd.tasks <- t:
	default:
		go nd.work(t)
	}
}

func (nd *node) work(t task) {
	nd.workers.Add(1)
	defer nd.workers.Add(-1)
	t.rd.run(t.i)
	idle := time.NewTimer(idleTimeout)
	defer idle.Stop()
	for {
		select {
		case t = <-nd.tasks:
			t.rd.run(t.i)
			idle.Reset(idleTimeout)
		case <-idle.C:
			return
		case <-nd.quit:
			return
		}
	}
}

// eval runs the command in args (an EVALSHA) on the node, falling back to
// EVAL of op's script when the node does not have it cached (a restarted
// node, SCRIPT FLUSH).
func (nd *node) eval(ctx context.Context, o op, args []any, h *handle) (int64, error) {
	return redisscript.Run(ctx, nd.c, o.script(), h.keys[:], args).Int64()
}

// anyPending reports whether a node's reply had not come when the round
// was decided.
func (rd *round) anyPending() bool {
	rd.mu.Lock()
	defer rd.mu.Unlock()
	for _, rep := range rd.res {
		if rep.err == errPending {
			return true
		}
	}
	return false
}
