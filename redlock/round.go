package redlock

import (
	"context"
	"errors"
	"fmt"
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
)

// script returns op's script and how many of the handle's ARGV it takes,
// for EVAL when a node does not have the script cached.
func (o op) script() (*goredis.Script, int) {
	switch o {
	case opAcquire:
		return redisscript.Acquire, 2
	case opExtend:
		return redisscript.Extend, 2
	}
	return redisscript.Release, 1
}

// reply is one node's answer in a round.
type reply struct {
	v    int64 // the script's reply
	err  error
	done bool // answered (v or err) before the round was decided
}

// round is one request sent to every node at once. The caller starts it
// and waits until the outcome is known: a majority said yes (early), every
// node answered, the per-node timeout passed or the caller's context
// ended. It then decides under mu, setting over. Replies after that are
// late: not recorded, and a late "set" of an acquire that did not keep the
// lock, or whose lock has been released since, is deleted again by the
// worker that got it.
//
// The requests run under a context detached from the caller's
// cancellation, bounded by the per-node timeout: a caller that stops
// waiting does not cut a request whose reply tells whether the key was
// set, nor the stragglers of a release decided by a majority. The last
// request to finish releases that context's timer.
type round struct {
	nodes   []*node
	op      op
	h       *handle
	args    []any // the command, shared read-only by every node's request
	timeout time.Duration
	early   int // > 0: end the wait once this many nodes said yes

	ctx    context.Context    // the requests'
	cancel context.CancelFunc // of ctx; called by the last request
	caller <-chan struct{}    // the caller's ctx.Done()
	done   chan struct{}      // closed when the wait can end

	mu      sync.Mutex
	over    bool // decided: later replies are late
	held    bool // an acquire round kept the lock
	left    int  // replies still expected before the decision
	pending int  // requests not finished, late ones included
	yes     int
	ended   bool // done is closed
	res     []reply
	buf     [maxInline]reply
}

// start sends args to every node at once, each with a timeout from now.
// early > 0 ends the wait as soon as that many nodes said yes (v > 0).
func (r *Resource) start(ctx context.Context, o op, h *handle, args []any, timeout time.Duration, early int) *round {
	rd := &round{nodes: r.nodes, op: o, h: h, args: args, timeout: timeout, early: early, done: make(chan struct{})}
	rctx := ctx
	if rd.caller = ctx.Done(); rd.caller != nil {
		rctx = context.WithoutCancel(ctx)
	}
	rd.ctx, rd.cancel = context.WithTimeout(rctx, timeout)
	if n := len(r.nodes); n <= maxInline {
		rd.res = rd.buf[:n]
	} else {
		rd.res = make([]reply, n)
	}
	rd.left = len(r.nodes)
	rd.pending = len(r.nodes)
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

// decide ends a release or extend round: ok counts the nodes that
// answered 1 (done), failed those that erred or did not answer in time.
func (rd *round) decide() (ok, failed int) {
	rd.mu.Lock()
	rd.over = true
	for _, rep := range rd.res {
		switch {
		case !rep.done || rep.err != nil:
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
		case !rep.done:
			errs = append(errs, fmt.Errorf("%s: no reply within %v", rd.nodes[i].name, rd.timeout))
		case rep.err != nil:
			errs = append(errs, fmt.Errorf("%s: %w", rd.nodes[i].name, rep.err))
		}
	}
	return fmt.Errorf("redlock: %s %q: %w: %d of %d nodes failed, %d must answer: %w",
		op, key, ErrNoQuorum, len(errs), len(rd.nodes), quorum, errors.Join(errs...))
}

// run sends the round's request to node i and records the reply.
func (rd *round) run(i int) {
	nd := rd.nodes[i]
	v, err := nd.eval(rd.ctx, rd.op, rd.args, rd.h)
	rd.mu.Lock()
	late := rd.over
	if !late {
		rd.res[i] = reply{v: v, err: err, done: true}
		rd.left--
		if err == nil && v > 0 {
			rd.yes++
		}
		if !rd.ended && (rd.left == 0 || (rd.early > 0 && rd.yes >= rd.early)) {
			rd.ended = true
			close(rd.done)
		}
	}
	held := rd.held
	rd.pending--
	last := rd.pending == 0
	rd.mu.Unlock()
	if late && rd.op == opAcquire && err == nil && v > 0 && (!held || rd.h.released.Load()) {
		// The node set our key after the round gave the lock up, or
		// after it was released: delete it rather than let it linger
		// until its TTL. (Release sets released before it sends, so a
		// set applied after Release's delete is seen here.)
		ctx, cancel := context.WithTimeout(context.WithoutCancel(rd.ctx), lateCleanupTimeout)
		_, _ = nd.eval(ctx, opRelease, rd.h.release[:], rd.h)
		cancel()
	}
	if last {
		rd.cancel()
	}
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
	cmd := goredis.NewCmd(ctx, args...)
	_ = nd.c.Process(ctx, cmd)
	v, err := cmd.Int64()
	if err != nil && goredis.HasErrorPrefix(err, "NOSCRIPT") {
		s, nargv := o.script()
		v, err = s.Eval(ctx, nd.c, h.keys[:], h.argv[:nargv]...).Int64()
	}
	return v, err
}
