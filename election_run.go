package distlock

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"time"

	"github.com/distlock/distlock/backend"
)

// observePoll is how often Observe reads the leader when no notice came:
// the bound on how late it sees a change the store did not announce (an
// expiry, a proclaim on a pull store, a lost notice).
const observePoll = time.Second

// observeFast is the first pause of the quick reads after a notice: a
// release is followed by the next grant within a round trip or two, so
// Observe reads again after 2ms, 4ms, ... until it sees a change (or
// reaches observePoll).
const observeFast = 2 * time.Millisecond

// Observe returns a channel of the election's leaders: the leader now
// (once there is one), then every change of leader or of its published
// value, in term order, each delivered once, until ctx ends or the
// DistributeLock is closed, when the channel closes. A reader that falls
// behind never holds up the election and skips what it missed: the
// channel keeps only the newest leader not yet delivered, so a slow reader
// always ends up with the current one. A vacancy is not delivered.
//
// Observe learns of a change from the store's watch (etcd, ZooKeeper) or
// release notices (Redis, PostgreSQL), reading the leader again at once
// and then quickly until the next leader shows, and otherwise by reading
// it once a second: a change the store does not announce (an expiry; a
// proclaim on Redis or SQL; any change on MySQL and Redlock, which send no
// notices) shows within about a second. Errors of the store are retried
// at that pace.
//
// Errors, with no I/O: an [ErrInvalid] error for a bad name or nil ctx;
// [ErrUnsupported] when the store cannot tell who holds a lock;
// [ErrClosed] after Close.
func (e *Election) Observe(ctx context.Context) (<-chan Leader, error) {
	in, err := e.inspector(ctx)
	if err != nil {
		return nil, err
	}
	out := make(chan Leader)
	go e.observe(ctx, in, out)
	return out, nil
}

// observe reads the leader on every notice and poll, and hands the newest
// change to out's reader, until ctx ends or d closes.
func (e *Election) observe(ctx context.Context, in backend.Inspector, out chan<- Leader) {
	defer close(out)
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	defer context.AfterFunc(e.d.closing, cancel)()
	notices, unwatch := e.watch()
	defer unwatch()
	var (
		last, pending Leader
		seen, waiting bool          // last was delivered; pending waits for the reader
		fast          time.Duration // the next quick read's pause after a notice; 0: none
	)
	t := time.NewTimer(0) // the first read at once
	defer t.Stop()
	for {
		var send chan<- Leader
		if waiting {
			send = out
		}
		select {
		case send <- pending:
			last, seen, waiting = pending, true, false
			continue
		case <-notices:
			fast = observeFast
		case <-t.C:
		case <-ctx.Done():
			return
		}
		l, ok, err := e.read(ctx, in)
		if ctx.Err() != nil {
			return
		}
		changed := false
		if err == nil && ok {
			ref, refSeen := last, seen
			if waiting {
				ref, refSeen = pending, true
			}
			if !refSeen || l.Term > ref.Term || l.Term == ref.Term && (l.Value != ref.Value || l.Label != ref.Label) {
				pending, waiting, changed = l, true, true
			}
		}
		next := observePoll
		if fast > 0 && !changed {
			next, fast = fast, 2*fast
			if fast >= observePoll {
				fast = 0
			}
		} else {
			fast = 0
		}
		t.Reset(next)
	}
}

// watch subscribes to the notices of changes of the election's mutex: the
// store's watch, or its release notices; a nil channel when it has none.
func (e *Election) watch() (<-chan struct{}, func()) {
	if w, ok := e.d.res.(backend.Watcher); ok {
		return w.Watch(e.key())
	}
	if e.d.notifyEach != nil {
		return e.d.notifyEach.Subscribe(e.key())
	}
	return nil, func() {}
}

// RunOption configures [Election.Run].
type RunOption func(*runConfig)

type runConfig struct {
	min, max  time.Duration
	started   func(lead *Lock)
	stopped   func(lead *Lock, err error)
	newLeader func(Leader)
	err       error
}

// WithRunBackoff sets how long [Election.Run] waits between the end of a
// leadership (or a failed campaign) and its next campaign: min after a
// leadership that lasted at least max, else twice the last wait, from min
// up to max, each drawn at random in [wait/2, wait]. Default 100ms, 10s.
// min <= 0 or max < min makes Run fail with [ErrInvalid].
func WithRunBackoff(min, max time.Duration) RunOption {
	return func(c *runConfig) {
		if min <= 0 || max < min {
			c.err = fmt.Errorf("%w: run backoff (%v, %v): want 0 < min <= max", ErrInvalid, min, max)
			return
		}
		c.min, c.max = min, max
	}
}

// OnStarted makes [Election.Run] call f when the candidate is elected,
// before the function runs. f must not block for long: the leadership is
// counted from the election.
func OnStarted(f func(lead *Lock)) RunOption {
	return func(c *runConfig) { c.started = f }
}

// OnStopped makes [Election.Run] call f once a leadership has ended: the
// function returned (or the leadership was lost and the function returned
// after its context was cancelled) and the leadership was resigned. err
// is the function's error joined with the resignation's ([ErrNotHeld]
// when the leadership was lost before).
func OnStopped(f func(lead *Lock, err error)) RunOption {
	return func(c *runConfig) { c.stopped = f }
}

// OnNewLeader makes [Election.Run] call f with every leader it observes
// ([Election.Observe]), this candidate included, from one goroutine, while
// Run runs. A slow f skips leaders, never holds up the election.
func OnNewLeader(f func(Leader)) RunOption {
	return func(c *runConfig) { c.newLeader = f }
}

// Run campaigns with value until elected, runs fn while leader, resigns
// when fn returns, and campaigns again after a backoff
// ([WithRunBackoff]), until ctx ends: the leader selector of Curator and
// client-go's leaderelection.RunOrDie. fn's context is cancelled, with
// cause [ErrNotHeld], when the leadership is lost (Done closed: a renewal
// found it gone or its validity ended), and when ctx ends; the
// leadership is resigned once fn returns, whatever it returned, with a
// context that outlives ctx's end for at most the lock's TTL, so the next
// candidate is elected at once. fn runs once at a time: Run waits for it
// to return before it campaigns again. fn's lead carries the term (Token)
// to fence its writes with. A panic in fn resigns, then goes on up.
//
// [OnStarted], [OnStopped] and [OnNewLeader] set callbacks. Run returns
// once ctx ended and every goroutine it started has ended: ctx's error.
// It returns at once an [ErrInvalid] error for bad input (nil fn or ctx,
// a bad name or value, a bad option), [ErrUnsupported] when the store
// cannot tell who holds a lock and OnNewLeader was given, [ErrClosed]
// when the DistributeLock is closed (also while it runs). Store errors
// are retried after the backoff.
func (e *Election) Run(ctx context.Context, value string, fn func(ctx context.Context, lead *Lock) error, opts ...RunOption) error {
	if err := e.check(ctx); err != nil {
		return err
	}
	if fn == nil {
		return fmt.Errorf("%w: nil function for election %s", ErrInvalid, quote(e.name))
	}
	if _, err := e.label(value); err != nil {
		return err
	}
	cfg := runConfig{min: 100 * time.Millisecond, max: 10 * time.Second}
	for _, o := range opts {
		if o == nil {
			return fmt.Errorf("%w: nil run option", ErrInvalid)
		}
		o(&cfg)
	}
	if cfg.err != nil {
		return cfg.err
	}
	var wg sync.WaitGroup
	defer wg.Wait()
	rctx, cancel := context.WithCancel(ctx)
	defer cancel()
	if cfg.newLeader != nil {
		leaders, err := e.Observe(rctx)
		if err != nil {
			return err
		}
		wg.Go(func() {
			for l := range leaders {
				cfg.newLeader(l)
			}
		})
	}
	wait := cfg.min
	for {
		lead, err := e.Campaign(rctx, value)
		switch {
		case ctx.Err() != nil:
			return ctx.Err()
		case errors.Is(err, ErrClosed), errors.Is(err, ErrInvalid), errors.Is(err, ErrUnsupported):
			return err
		case err != nil: // the store failed: campaign again after the backoff
			wait = min(2*wait, cfg.max)
		default:
			began := time.Now()
			e.lead(rctx, lead, fn, &cfg)
			if time.Since(began) >= cfg.max {
				wait = cfg.min
			} else {
				wait = min(2*wait, cfg.max)
			}
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
		if e.d.isClosed() {
			return ErrClosed
		}
		t := time.NewTimer(wait/2 + rand.N(wait/2+1))
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			return ctx.Err()
		}
	}
}

// lead runs fn for the leadership lead and resigns it, as Do does for a
// lock, with Run's callbacks around.
func (e *Election) lead(ctx context.Context, lead *Lock, fn func(ctx context.Context, lead *Lock) error, cfg *runConfig) {
	if cfg.started != nil {
		cfg.started(lead)
	}
	fctx, cancel := context.WithCancelCause(ctx)
	stop := make(chan struct{})
	watched := make(chan struct{})
	go func() {
		defer close(watched)
		select {
		case <-lead.Done():
			cancel(lead.g.err())
		case <-stop:
		}
	}()
	var err error
	defer func() {
		close(stop)
		<-watched
		cancel(nil)
		uctx, ucancel := context.WithTimeout(context.WithoutCancel(ctx), lead.g.ttl())
		uerr := lead.Unlock(uctx)
		ucancel()
		if uerr != nil && !isFinal(uerr) {
			// Nobody else holds a handle: keep resigning in the
			// background until the store answers (or Close's bound).
			e.d.bg.goRun("resigning "+quote(e.key()), func(ctx context.Context) error {
				return retry(ctx, lead.Unlock)
			})
		}
		if cfg.stopped != nil {
			cfg.stopped(lead, errors.Join(err, uerr))
		}
	}()
	err = fn(fctx, lead)
}
