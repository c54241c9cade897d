package redis

import (
	"context"
	"sync"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/distlock/distlock/backend"
	"github.com/distlock/distlock/internal/redisscript"
)

// Natural batching.
//
// Every script call of run goes through the Resource's dispatcher. A call
// that finds fewer than maxInFlight batches in flight is sent at once, in
// a batch of its own (with any call queued before it); one that finds
// them all busy waits in the queue, and the worker whose batch returns
// first sends everything queued by then as the next batch, in one
// pipeline. A lone caller thus pays no added latency, and callers that
// overlap share round trips: under load a batch carries every call made
// while the batches before it were in flight.
//
// Each call keeps its own reply and error: a pipeline's commands are
// independent (a script that fails fails only its own call), and a
// command the server had no script for is sent again with EVAL. A reply
// lost after sending (a broken connection, a timeout) is every sent
// call's error, as it would be for a call sent alone, and each caller
// handles its ambiguity as before (TryAcquire cleans up, see failed).
//
// A caller returns when its context ends, whatever the batch does (see
// runCall): a call still queued is then taken out of the queue and never
// sent; one already sent runs on. A batch none of whose callers waits any
// longer stops counting as in flight, so a batch stuck on a connection
// that does not answer holds back the next one only while someone waits
// for it; the next batch then goes on another connection of the pool.
//
// On Cluster (and over a Ring) the pipeline is the client's: it groups
// the batch's commands by node and sends each group on its node's
// connection, the groups concurrently; the batch returns when every node
// answered.

// maxInFlight is how many batches a Resource keeps in flight at once,
// each on a connection of its own. One would batch the most, but leaves
// the server idle while the client reads a batch's replies and makes the
// next calls, and the client idle while the server runs the batch: with
// 16 goroutines on distinct keys it made fewer cycles than no batching at
// all (bench, parallel workload, 2 CPUs shared by client and server).
// Four overlaps both sides and still carries several calls per request
// under load (0.7 requests per cycle of two calls at 16 goroutines, 0.2
// at 64).
const maxInFlight = 4

// Call states, under Resource.mu.
const (
	callQueued = iota // in Resource.queue
	callSent          // in a batch in flight
	callDone          // its reply is in v, val, err; done is (or will be) signalled
)

// call is one request of run. Calls are reused, except one whose caller
// stopped waiting after it was sent (its batch may still write to it).
type call struct {
	ctx  context.Context
	io   ioContext // ctx as the client sees it, for a bounded context (see send)
	s    *goredis.Script
	keys []string
	cmd  []any
	// Room for a command and its keys built per call (see newCall), so
	// that nothing needs to be kept per lock between calls.
	args  [8]any
	key   [1]string
	value bool // the reply goes to val, not v
	v     int64
	val   any
	err   error
	state int
	b     *batch        // the call's batch while it is sent
	done  chan struct{} // buffered 1: the worker never blocks
}

var calls = sync.Pool{New: func() any { return &call{done: make(chan struct{}, 1)} }}

// batch is the calls sent together in one pipeline.
type batch struct {
	calls   []*call
	cmds    []*goredis.Cmd
	waiting int  // calls whose caller still waits, under Resource.mu
	dead    bool // no caller waits: the batch no longer counts in live
}

var batches = sync.Pool{New: func() any { return new(batch) }}

// run sends cmd, a prebuilt EVALSHA of s with keys, and falls back to EVAL
// when the server does not have the script cached (as Script.Run). It
// returns when the reply came or ctx ended, whichever is first: a client
// honours a context's deadline only when built with ContextTimeoutEnabled,
// and its cancellation never, so the request runs on a worker goroutine
// whenever ctx can end before the client returns (see send), batched with
// the calls that overlap it (see Natural batching above). A request cut
// short that way runs on until
// the client gives up on it (its ReadTimeout, or the batch's deadline
// under ContextTimeoutEnabled), and may still reach the server: the
// caller decides what that means (see TryAcquire).
func (r *Resource) run(ctx context.Context, s *goredis.Script, keys []string, cmd []any) (int64, error) {
	v, _, err := r.runCall(ctx, s, keys, cmd, false)
	return v, err
}

// runValue is run for a script whose reply is not an integer: it returns
// the reply as go-redis reads it (an []any for an array).
func (r *Resource) runValue(ctx context.Context, s *goredis.Script, keys []string, cmd []any) (any, error) {
	_, val, err := r.runCall(ctx, s, keys, cmd, true)
	return val, err
}

func (r *Resource) runCall(ctx context.Context, s *goredis.Script, keys []string, cmd []any, value bool) (int64, any, error) {
	c := newCall()
	c.s, c.keys, c.cmd, c.value = s, keys, cmd, value
	return r.send(ctx, c)
}

// newCall returns a call from the pool, whose s, keys and cmd the caller
// sets before send. Its command and key may be built in its own args and
// key arrays: they live as long as the call, which is not reused while a
// batch may still read them.
func newCall() *call { return calls.Get().(*call) }

// scriptCall returns a call of s on the one key lock, with the arguments
// args (the call's ARGV), built in the call's own arrays.
func scriptCall(s *goredis.Script, sha any, lock string, args ...any) *call {
	c := newCall()
	c.key[0] = lock
	c.s, c.keys = s, c.key[:]
	c.cmd = append(append(c.args[:0], "evalsha", sha, 1, lock), args...)
	return c
}

// evalsha returns the command EVALSHA sha with keys and args.
func evalsha(sha any, keys []string, args ...any) []any {
	cmd := make([]any, 0, 3+len(keys)+len(args))
	cmd = append(cmd, "evalsha", sha, len(keys))
	for _, k := range keys {
		cmd = append(cmd, k)
	}
	return append(cmd, args...)
}

// send runs c, from newCall, as run does, and gives it back to the pool
// (unless a batch may still read it).
//
// A call whose context cannot end runs on the caller's goroutine, unless
// it is batched with calls queued before it. So does one whose context is
// an acquisition's (backend.BoundedContext) that the caller cannot
// cancel, when the client bounds its I/O by the context's deadline (see
// boundedView): the client then returns by the deadline itself, and Close
// is seen between requests (Err), so nothing needs watching. Only a call
// whose context may end before the client would return waits for its
// reply from another goroutine, to return at that end.
func (r *Resource) send(ctx context.Context, c *call) (int64, any, error) {
	var done <-chan struct{}
	if bc, ok := ctx.(backend.BoundedContext); ok && r.bounded {
		c.io.BoundedContext = bc
		c.ctx, done = &c.io, bc.Cancelled()
	} else {
		c.ctx, done = ctx, ctx.Done()
	}
	r.mu.Lock()
	r.queue = append(r.queue, c)
	c.state = callQueued
	b := r.nextLocked()
	r.mu.Unlock()
	if b != nil {
		if done == nil && len(b.calls) == 1 {
			// Nothing to wait for but the reply: send it from here.
			r.exec(b)
			if next := r.finish(b); next != nil {
				r.submit(next)
			}
		} else {
			r.submit(b)
		}
	}
	select {
	case <-c.done:
	case <-done:
		r.mu.Lock()
		switch c.state {
		case callQueued: // never sent: nothing of it reaches the server
			r.unqueueLocked(c)
			r.mu.Unlock()
			*c = call{done: c.done}
			calls.Put(c)
			return 0, nil, ctx.Err()
		case callSent:
			b := c.b
			b.waiting--
			var next *batch
			if b.waiting == 0 && !b.dead {
				b.dead = true
				r.live--
				next = r.nextLocked()
			}
			r.mu.Unlock()
			if next != nil {
				r.submit(next)
			}
			// c is its batch's now: it is not reused.
			return 0, nil, ctx.Err()
		}
		// The reply came with the end: take it.
		r.mu.Unlock()
		<-c.done
	}
	v, val, err := c.v, c.val, c.err
	*c = call{done: c.done}
	calls.Put(c)
	return v, val, err
}

// ioContext is an acquisition's context as the client sees it when the
// client bounds its I/O by the deadline: its Done is the caller's
// cancellation only (Cancelled), which costs no timer; Deadline, Err and
// Value are the context's own.
type ioContext struct{ backend.BoundedContext }

// Done returns the caller's cancellation.
func (c *ioContext) Done() <-chan struct{} { return c.BoundedContext.Cancelled() }

// nextLocked returns the queued calls as a batch, counted in flight, when
// there are some and fewer than maxInFlight batches are; else nil. r.mu
// is held.
func (r *Resource) nextLocked() *batch {
	if len(r.queue) == 0 || r.live >= maxInFlight {
		return nil
	}
	b := batches.Get().(*batch)
	// The queue's array becomes the batch's, and the batch's (empty) the
	// queue's: no copy, no allocation once both have grown.
	b.calls, r.queue = r.queue, b.calls[:0]
	for _, c := range b.calls {
		c.state, c.b = callSent, b
	}
	b.waiting = len(b.calls)
	r.live++
	return b
}

// unqueueLocked takes c out of the queue. r.mu is held.
func (r *Resource) unqueueLocked(c *call) {
	for i, q := range r.queue {
		if q == c {
			n := copy(r.queue[i:], r.queue[i+1:])
			r.queue[i+n] = nil
			r.queue = r.queue[:i+n]
			return
		}
	}
}

// finish hands b's replies to their callers, and returns the next batch
// when calls were queued meanwhile (counted in flight: the caller must
// send it).
func (r *Resource) finish(b *batch) *batch {
	r.mu.Lock()
	for _, c := range b.calls {
		c.state, c.b = callDone, nil
	}
	if !b.dead {
		r.live--
	}
	next := r.nextLocked()
	r.mu.Unlock()
	for i, c := range b.calls {
		c.done <- struct{}{}
		b.calls[i] = nil
	}
	clear(b.cmds)
	b.calls, b.cmds = b.calls[:0], b.cmds[:0]
	b.waiting, b.dead = 0, false
	batches.Put(b)
	return next
}

// submit runs b, and the batches after it, on an idle worker or on a new
// one. Workers stay idle for workerIdle, so a steady load reuses them (a
// handoff to a parked goroutine costs less than starting one), and
// batches stuck on a server that stopped answering get as many as they
// need.
func (r *Resource) submit(b *batch) {
	select {
	case r.tasks <- b:
	default:
		go r.work(b)
	}
}

func (r *Resource) work(b *batch) {
	r.runBatches(b)
	idle := time.NewTimer(workerIdle)
	defer idle.Stop()
	for {
		select {
		case b = <-r.tasks:
			r.runBatches(b)
			idle.Reset(workerIdle)
		case <-idle.C:
			return
		case <-r.quit:
			return
		}
	}
}

// runBatches sends b, then each batch queued while the one before was in
// flight, until none is.
func (r *Resource) runBatches(b *batch) {
	for b != nil {
		r.exec(b)
		b = r.finish(b)
	}
}

// exec sends b's calls and writes each one's reply. A call alone goes as
// it is, with its own context; calls together go in one pipeline under a
// context that never ends, with the latest of their deadlines (for a
// client with ContextTimeoutEnabled; none if one has no deadline): the
// callers themselves stop waiting at their context's end.
func (r *Resource) exec(b *batch) {
	if len(b.calls) == 1 {
		c := b.calls[0]
		c.reply(r.runNow(c.ctx, c.s, c.keys, c.cmd))
		return
	}
	ctx := batchContext(b.calls)
	pipe := r.c.Pipeline()
	for _, c := range b.calls {
		cmd := goredis.NewCmd(ctx, c.cmd...)
		_ = pipe.Process(ctx, cmd)
		b.cmds = append(b.cmds, cmd)
	}
	_, _ = pipe.Exec(ctx)
	redisscript.Resend(ctx, r.c, len(b.calls), func(i int) *goredis.Cmd { return b.cmds[i] },
		func(i int, p goredis.Pipeliner) {
			c := b.calls[i]
			b.cmds[i] = c.s.Eval(ctx, p, c.keys, c.cmd[3+len(c.keys):]...)
		})
	for i, c := range b.calls {
		c.reply(b.cmds[i])
	}
}

// reply reads cmd's reply into c: into val when c wants the reply as it
// is, else into v as an integer.
func (c *call) reply(cmd *goredis.Cmd) {
	if c.value {
		c.val, c.err = cmd.Result()
	} else {
		c.v, c.err = cmd.Int64()
	}
}

// runNow sends one call from the calling goroutine, and sends it again
// with EVAL when the server does not have the script cached.
func (r *Resource) runNow(ctx context.Context, s *goredis.Script, keys []string, cmd []any) *goredis.Cmd {
	return redisscript.Run(ctx, r.c, s, keys, cmd)
}

// batchContext is the context of a pipeline of calls: it never ends and
// carries no values (a batch is nobody's in particular), and its deadline
// is the latest of the calls' deadlines, or none if one has none.
func batchContext(cs []*call) context.Context {
	var latest time.Time
	for _, c := range cs {
		d, ok := c.ctx.Deadline()
		if !ok {
			return context.Background()
		}
		if d.After(latest) {
			latest = d
		}
	}
	return deadlineContext{context.Background(), latest}
}

// deadlineContext reports a deadline without ending at it: for a client
// that sets its I/O deadlines from the context's (ContextTimeoutEnabled).
type deadlineContext struct {
	context.Context
	deadline time.Time
}

func (c deadlineContext) Deadline() (time.Time, bool) { return c.deadline, true }
