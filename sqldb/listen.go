package sqldb

import (
	"context"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// listenIdle is how long the LISTEN connection stays open after the last
// subscription ends, so a process that waits again soon does not pay a new
// connection each time.
const listenIdle = time.Second

// listener owns one dedicated LISTEN connection per [Postgres], open only
// while the process has subscribers (plus listenIdle), and fans the
// notifications out: those of the table's channel to the subscribers of
// the key in the payload, those of its queue channel (the channel's name
// and _q: a notice addressed to the head of a queue) to the subscriber of
// the owner value in the payload.
// The connection is taken from the pool and then removed from it
// (hijacked), so it is made exactly as the pool makes its connections:
// BeforeConnect (dynamic credentials), AfterConnect and the rest run for
// it. It then no longer counts against the pool's MaxConns, and it is
// closed, never returned: a connection that LISTENs would hand
// notifications to whoever got it next.
type listener struct {
	pool     *pgxpool.Pool
	channel  string
	qchannel string // channel + "_q"
	idle     time.Duration

	mu      sync.Mutex
	subs    map[string]map[*chan struct{}]struct{} // by key
	waiters map[string]map[*chan struct{}]struct{} // by owner value
	// unclaimed holds the notices addressed to an owner value nobody here
	// subscribed as, with when they came, for unclaimedFor: its waiter
	// may subscribe just after (its attempt queued it, and the release
	// came before its subscription). At most maxUnclaimed.
	unclaimed map[string]time.Time
	n         int                // live subscriptions
	stop      context.CancelFunc // non-nil while a listen goroutine runs
	timer     *time.Timer        // pending idle stop
	closed    bool
	wg        sync.WaitGroup
	running   int // listen goroutines not yet returned (tests)
	conns     int // successful LISTENs so far (tests)
}

func newListener(pool *pgxpool.Pool, channel string) *listener {
	return &listener{
		pool:     pool,
		channel:  channel,
		qchannel: channel + "_q",
		idle:     listenIdle,
		subs:     make(map[string]map[*chan struct{}]struct{}),
		waiters:  make(map[string]map[*chan struct{}]struct{}),
	}
}

// subscribe asks for the notices of key (the table's channel).
func (ln *listener) subscribe(key string) (<-chan struct{}, func()) {
	return ln.add(key, "", false)
}

// subscribeWaiter asks for the notices addressed to the waiter whose
// owner value is owner (the queue channel).
func (ln *listener) subscribeWaiter(owner string) (<-chan struct{}, func()) {
	return ln.add("", owner, true)
}

// subscribeHead asks, on one channel, for the notices of key and those
// addressed to owner; one addressed to owner that came within
// unclaimedFor before is sent at once.
func (ln *listener) subscribeHead(key, owner string) (<-chan struct{}, func()) {
	return ln.add(key, owner, true)
}

// A notice addressed to a waiter that has not subscribed yet is kept for
// unclaimedFor, and at most maxUnclaimed such notices are kept.
const (
	unclaimedFor = time.Second
	maxUnclaimed = 1024
)

// add makes one subscription, to the notices of key (if not "") and to
// those addressed to owner (if queued), and starts the listen goroutine if
// none runs.
func (ln *listener) add(key, owner string, queued bool) (<-chan struct{}, func()) {
	ln.mu.Lock()
	defer ln.mu.Unlock()
	if ln.closed {
		return nil, func() {}
	}
	ch := make(chan struct{}, 1)
	if key != "" {
		addTo(ln.subs, key, &ch)
	}
	if queued {
		if at, ok := ln.unclaimed[owner]; ok {
			delete(ln.unclaimed, owner)
			if time.Since(at) < unclaimedFor {
				ch <- struct{}{}
			}
		}
		addTo(ln.waiters, owner, &ch)
	}
	ln.n++
	if ln.timer != nil {
		ln.timer.Stop()
		ln.timer = nil
	}
	if ln.stop == nil {
		ctx, cancel := context.WithCancel(context.Background())
		ln.stop = cancel
		ln.wg.Add(1)
		ln.running++
		go ln.run(ctx)
	}
	var once sync.Once
	return ch, func() { once.Do(func() { ln.unsubscribe(key, owner, queued, &ch) }) }
}

func addTo(subs map[string]map[*chan struct{}]struct{}, name string, ch *chan struct{}) {
	set := subs[name]
	if set == nil {
		set = make(map[*chan struct{}]struct{})
		subs[name] = set
	}
	set[ch] = struct{}{}
}

// removeFrom removes ch from the subscribers of name and reports whether
// it was there (close drops every subscription).
func removeFrom(subs map[string]map[*chan struct{}]struct{}, name string, ch *chan struct{}) bool {
	set := subs[name]
	if _, ok := set[ch]; !ok {
		return false
	}
	delete(set, ch)
	if len(set) == 0 {
		delete(subs, name)
	}
	return true
}

func (ln *listener) unsubscribe(key, owner string, queued bool, ch *chan struct{}) {
	ln.mu.Lock()
	defer ln.mu.Unlock()
	was := false
	if key != "" {
		was = removeFrom(ln.subs, key, ch)
	}
	if queued {
		was = removeFrom(ln.waiters, owner, ch) || was
	}
	if !was {
		return // dropped by close
	}
	ln.n--
	if ln.n == 0 && ln.stop != nil && !ln.closed {
		var t *time.Timer
		t = time.AfterFunc(ln.idle, func() {
			ln.mu.Lock()
			defer ln.mu.Unlock()
			if ln.timer != t || ln.n > 0 {
				return // superseded by a new subscription
			}
			ln.timer = nil
			ln.stop()
			ln.stop = nil
		})
		ln.timer = t
	}
}

// close stops the listen goroutine, if any, and waits for it.
func (ln *listener) close() {
	ln.mu.Lock()
	ln.closed = true
	if ln.timer != nil {
		ln.timer.Stop()
		ln.timer = nil
	}
	if ln.stop != nil {
		ln.stop()
		ln.stop = nil
	}
	ln.subs = make(map[string]map[*chan struct{}]struct{})
	ln.waiters = make(map[string]map[*chan struct{}]struct{})
	ln.n = 0
	ln.mu.Unlock()
	ln.wg.Wait()
}

// run keeps one connection LISTENing until ctx ends, reconnecting with
// backoff after a failure.
func (ln *listener) run(ctx context.Context) {
	defer func() {
		ln.mu.Lock()
		ln.running--
		ln.mu.Unlock()
		ln.wg.Done()
	}()
	backoff := 10 * time.Millisecond
	for ctx.Err() == nil {
		if ln.listen(ctx) {
			backoff = 10 * time.Millisecond
			continue
		}
		t := time.NewTimer(backoff)
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-t.C:
		}
		backoff = min(2*backoff, time.Second)
	}
}

// listen takes a connection from the pool, LISTENs and delivers
// notifications until the connection fails or ctx ends. It reports whether
// it got as far as LISTEN.
func (ln *listener) listen(ctx context.Context) bool {
	pc, err := ln.pool.Acquire(ctx)
	if err != nil {
		return false
	}
	conn := pc.Hijack()
	defer func() {
		cctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		conn.Close(cctx)
	}()
	if _, err := conn.Exec(ctx, "LISTEN "+pgx.Identifier{ln.channel}.Sanitize()+"; LISTEN "+pgx.Identifier{ln.qchannel}.Sanitize()); err != nil {
		return false
	}
	ln.mu.Lock()
	ln.conns++
	ln.mu.Unlock()
	// A release between a waiter's failed attempt and this LISTEN was not
	// heard: wake everyone once so they try again now.
	ln.wakeAll()
	for {
		n, err := conn.WaitForNotification(ctx)
		if err != nil {
			return true
		}
		if n.Channel == ln.qchannel {
			ln.wakeWaiter(n.Payload)
		} else {
			ln.wake(n.Payload)
		}
	}
}

// wakeWaiter wakes the waiter whose owner value a queue notice names.
func (ln *listener) wakeWaiter(owner string) {
	ln.mu.Lock()
	defer ln.mu.Unlock()
	set := ln.waiters[owner]
	if len(set) > 0 {
		wakeSet(set)
		return
	}
	now := time.Now()
	if ln.unclaimed == nil {
		ln.unclaimed = make(map[string]time.Time)
	}
	if len(ln.unclaimed) >= maxUnclaimed {
		for v, at := range ln.unclaimed {
			if now.Sub(at) >= unclaimedFor {
				delete(ln.unclaimed, v)
			}
		}
		if len(ln.unclaimed) >= maxUnclaimed {
			return
		}
	}
	ln.unclaimed[owner] = now
}

// wake wakes the subscribers of the key a notice's payload names (both
// keys, when it may name either: see notifyPayload).
func (ln *listener) wake(payload string) {
	key, alt, two := payloadKeys(payload)
	ln.mu.Lock()
	defer ln.mu.Unlock()
	ln.wakeLocked(key)
	if two {
		ln.wakeLocked(alt)
	}
}

func (ln *listener) wakeLocked(key string) { wakeSet(ln.subs[key]) }

func wakeSet(set map[*chan struct{}]struct{}) {
	for ch := range set {
		select {
		case *ch <- struct{}{}:
		default:
		}
	}
}

func (ln *listener) wakeAll() {
	ln.mu.Lock()
	defer ln.mu.Unlock()
	for _, set := range ln.subs {
		wakeSet(set)
	}
	for _, set := range ln.waiters {
		wakeSet(set)
	}
}
