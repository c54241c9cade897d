package redis

import (
	"context"
	"errors"
	"net"
	"sync"
	"time"

	goredis "github.com/redis/go-redis/v9"
)

// subscribeTimeout bounds one SUBSCRIBE/UNSUBSCRIBE write (and the dial
// before it) made by the hub's goroutine.
const subscribeTimeout = 5 * time.Second

// healthInterval is how long a subscription connection may stay silent
// before its forwarder sends a PING; a PING unanswered for as long again
// makes the hub replace the connection. go-redis's own PubSub channels
// check health the same way (every 3s by default).
const healthInterval = 3 * time.Second

// Backoff of the hub's re-subscriptions after a connection failed in a
// way go-redis does not repair: the first retry after retryMin, doubling
// up to retryMax while the failures go on.
const (
	retryMin = 100 * time.Millisecond
	retryMax = 30 * time.Second
)

// hub is a Resource's release-notice fan-out. Waiters register per channel
// under mu; one goroutine (run) owns the subscriptions and reconciles what
// Redis is subscribed to with what waiters want, so subscribe and
// unsubscribe commands for one channel can never reorder. One forwarding
// goroutine per PubSub connection passes each notice to the waiters, and
// reports to run what only the connection sees (events).
//
// go-redis reconnects a PubSub whose connection broke and subscribes its
// channels again, in one command per kind. On Cluster one SSUBSCRIBE may
// only name channels of one slot, and a connection here carries the
// channels of every slot of its master that someone waits for: Redis
// refuses that SSUBSCRIBE (CROSSSLOT), and the connection is subscribed
// to nothing. A master also unsubscribes its clients from the channels of
// a slot it gives away (SUNSUBSCRIBE), and go-redis keeps them in its set.
// So the hub does not rely on go-redis's re-subscription: a connection on
// which the server refused a command, or that lost a channel, is closed,
// and its channels are subscribed again by run, one SSUBSCRIBE each, on
// the master that serves them then.
type hub struct {
	c       goredis.UniversalClient
	cluster *goredis.ClusterClient

	mu      sync.Mutex
	waiters map[string]map[*waiter]struct{} // channel -> waiters; no empty sets
	events  []event                         // from the forwarders, for run
	started bool
	closed  bool

	// idle holds, for each channel whose last waiter left, when it left:
	// run keeps the channel subscribed for lingerFor more, so that the
	// next waiter of a busy key finds it subscribed (no SUBSCRIBE, no
	// wake-up of every waiter on its confirmation). Under mu.
	idle map[string]time.Time

	// unclaimed holds the notices addressed to a waiter nobody here was
	// subscribed as, with when they came, for unclaimedFor: the waiter
	// may subscribe just after (its attempt queued it, and the release
	// came before its subscription). At most maxUnclaimed; under mu.
	unclaimed map[string]time.Time

	kick chan struct{} // buffered 1: waiters changed or an event came
	stop context.CancelFunc
	done chan struct{} // closed when run and every forwarder returned
}

type waiter struct {
	ch chan struct{}
	// value is the owner value of a queued waiter, which receives only
	// the notices addressed to it or to everyone; "" for a waiter that
	// receives every notice of its channel.
	value string
}

// lingerFor is how long a channel stays subscribed after its last waiter
// left.
const lingerFor = time.Second

// A notice addressed to a waiter that has not subscribed yet is kept for
// unclaimedFor, and at most maxUnclaimed such notices are kept.
const (
	unclaimedFor = time.Second
	maxUnclaimed = 1024
)

// event is what a forwarder tells run about its connection.
type event struct {
	kind    eventKind
	c       *conn
	channel string // evDropped
}

type eventKind uint8

const (
	// evFailed: the server refused a command on the connection (CROSSSLOT
	// after go-redis's re-subscription, MOVED, an ACL's NOPERM), or it
	// did not answer a PING: run replaces it.
	evFailed eventKind = iota
	// evDropped: the connection is no longer subscribed to channel,
	// which run may still want there (the server gave its slot away).
	evDropped
	// evConfirmed: the connection's first subscription was confirmed: it
	// works, and the backoff starts over.
	evConfirmed
)

func newHub(c goredis.UniversalClient, cluster *goredis.ClusterClient) *hub {
	return &hub{
		c:       c,
		cluster: cluster,
		waiters: make(map[string]map[*waiter]struct{}),
		kick:    make(chan struct{}, 1),
		done:    make(chan struct{}),
	}
}

func (h *hub) poke() {
	select {
	case h.kick <- struct{}{}:
	default:
	}
}

// post hands an event to run.
func (h *hub) post(e event) {
	h.mu.Lock()
	h.events = append(h.events, e)
	h.mu.Unlock()
	h.poke()
}

// subscribe registers a waiter for channel and, when it is the first,
// asks the goroutine to subscribe. A waiter with a value (a queued one)
// receives only the notices addressed to value or to everyone, and at
// once one addressed to value that came within unclaimedFor. It does no
// I/O itself.
func (h *hub) subscribe(channel, value string) (<-chan struct{}, func()) {
	w := &waiter{ch: make(chan struct{}, 1), value: value}
	h.mu.Lock()
	if h.closed {
		h.mu.Unlock()
		return nil, func() {}
	}
	if at, ok := h.unclaimed[value]; ok && value != "" {
		delete(h.unclaimed, value)
		if time.Since(at) < unclaimedFor {
			w.ch <- struct{}{}
		}
	}
	if !h.started {
		h.started = true
		ctx, cancel := context.WithCancel(context.Background())
		h.stop = cancel
		go h.run(ctx)
	}
	set := h.waiters[channel]
	if set == nil {
		set = make(map[*waiter]struct{}, 1)
		h.waiters[channel] = set
		delete(h.idle, channel)
		h.poke()
	}
	set[w] = struct{}{}
	h.mu.Unlock()

	var once sync.Once
	return w.ch, func() {
		once.Do(func() {
			h.mu.Lock()
			defer h.mu.Unlock()
			set := h.waiters[channel]
			delete(set, w)
			if len(set) == 0 && set != nil {
				delete(h.waiters, channel)
				if h.idle == nil {
					h.idle = make(map[string]time.Time)
				}
				h.idle[channel] = time.Now()
				if !h.closed {
					h.poke()
				}
			}
		})
	}
}

// notify wakes the waiters of channel a notice addressed to to concerns,
// without blocking: with to == "", every one; otherwise the queued waiter
// whose value is to, and those that are not queued. A notice to a queued
// waiter not subscribed here is kept a while (unclaimed).
func (h *hub) notify(channel, to string) {
	h.mu.Lock()
	claimed := to == ""
	for w := range h.waiters[channel] {
		if to != "" && w.value != "" && w.value != to {
			continue
		}
		claimed = claimed || w.value == to
		select {
		case w.ch <- struct{}{}:
		default:
		}
	}
	if !claimed {
		h.keepUnclaimed(to)
	}
	h.mu.Unlock()
}

// keepUnclaimed keeps a notice addressed to the queued waiter value, which
// is not subscribed here (yet). Under mu.
func (h *hub) keepUnclaimed(value string) {
	now := time.Now()
	if h.unclaimed == nil {
		h.unclaimed = make(map[string]time.Time)
	}
	if len(h.unclaimed) >= maxUnclaimed {
		for v, at := range h.unclaimed {
			if now.Sub(at) >= unclaimedFor {
				delete(h.unclaimed, v)
			}
		}
		if len(h.unclaimed) >= maxUnclaimed {
			return
		}
	}
	h.unclaimed[value] = now
}

// close stops the goroutines and closes the PubSub connections.
func (h *hub) close() error {
	h.mu.Lock()
	if h.closed {
		h.mu.Unlock()
		return nil
	}
	h.closed = true
	started := h.started
	h.mu.Unlock()
	if !started {
		return nil
	}
	h.stop()
	<-h.done
	return nil
}

// conn is one PubSub connection and its forwarder.
type conn struct {
	ps      *goredis.PubSub
	node    string        // its key in the subscriptions' conns
	closing chan struct{} // closed by run before it closes ps
	done    chan struct{} // closed when the forwarder returned

	// unsubscribing counts, per channel, the unsubscriptions run sent
	// whose confirmation has not come back: a confirmation is an
	// evDropped that run must not take for the server's. Run's only.
	unsubscribing map[string]int
}

// subscriptions is run's state: the connections and what each is
// subscribed to.
type subscriptions struct {
	conns map[string]*conn // by node address; "" outside Cluster
	have  map[string]*conn // subscribed channel -> its connection

	failures  int       // connections failed since one last worked
	notBefore time.Time // no subscription before then (backoff)
	retry     *time.Timer
	linger    *time.Timer // fires when the first idle channel is due to go
}

// run owns the subscriptions: on every kick it handles the forwarders'
// events, subscribes the channels waiters want and unsubscribes the ones
// nobody waits for any more.
func (h *hub) run(ctx context.Context) {
	defer close(h.done)
	s := &subscriptions{conns: make(map[string]*conn), have: make(map[string]*conn)}
	s.retry = time.NewTimer(time.Hour)
	s.retry.Stop()
	s.linger = time.NewTimer(time.Hour)
	s.linger.Stop()
	defer func() {
		s.retry.Stop()
		s.linger.Stop()
		for _, c := range s.conns {
			h.shut(c)
		}
	}()
	for {
		select {
		case <-ctx.Done():
			return
		case <-h.kick:
		case <-s.retry.C:
		case <-s.linger.C:
		}
		h.handle(s)
		h.reconcile(ctx, s)
	}
}

// shut closes c and waits for its forwarder.
func (h *hub) shut(c *conn) {
	close(c.closing)
	_ = c.ps.Close()
	<-c.done
}

// handle applies the forwarders' events to s.
func (h *hub) handle(s *subscriptions) {
	h.mu.Lock()
	evs := h.events
	h.events = nil
	h.mu.Unlock()
	for _, e := range evs {
		switch e.kind {
		case evConfirmed:
			if s.conns[e.c.node] == e.c {
				s.failures = 0
			}
		case evDropped:
			if n := e.c.unsubscribing[e.channel]; n > 0 {
				e.c.unsubscribing[e.channel] = n - 1 // ours, confirmed
				if n == 1 {
					delete(e.c.unsubscribing, e.channel)
				}
				continue
			}
			if s.have[e.channel] != e.c {
				continue // gone from this connection already
			}
			// go-redis keeps the channel in the connection's set and
			// would subscribe it there again after a reconnect, where
			// the server refuses it; unsubscribing it is refused too
			// (MOVED). Replace the connection.
			fallthrough
		case evFailed:
			if s.conns[e.c.node] != e.c {
				continue // replaced already
			}
			delete(s.conns, e.c.node)
			h.shut(e.c)
			for ch, c := range s.have {
				if c == e.c {
					delete(s.have, ch)
				}
			}
			s.failures++
			s.notBefore = time.Now().Add(min(retryMin<<min(s.failures-1, 20), retryMax))
			if h.cluster != nil {
				// The slot map may be what is wrong (a slot moved):
				// have it read again before the next subscription.
				h.cluster.ReloadState(context.Background())
			}
		}
	}
}

// reconcile subscribes the channels waiters want and unsubscribes the
// ones nobody waits for any more. Outside Cluster each direction is one
// command; on Cluster one per channel (SSUBSCRIBE takes one slot at a time).
// After a connection failed, it subscribes nothing before s.notBefore,
// and arms s.retry for then.
func (h *hub) reconcile(ctx context.Context, s *subscriptions) {
	var add, drop []string
	var next time.Duration // until the first idle channel that stays is due
	now := time.Now()
	h.mu.Lock()
	for ch := range h.waiters {
		if _, ok := s.have[ch]; !ok {
			add = append(add, ch)
		}
	}
	for ch := range s.have {
		if _, ok := h.waiters[ch]; !ok {
			if at, ok := h.idle[ch]; ok && now.Sub(at) < lingerFor {
				if left := lingerFor - now.Sub(at); next == 0 || left < next {
					next = left
				}
				continue
			}
			drop = append(drop, ch)
		}
	}
	for ch, at := range h.idle {
		if now.Sub(at) >= lingerFor {
			delete(h.idle, ch)
		}
	}
	h.mu.Unlock()
	if next > 0 {
		s.linger.Reset(next)
	}
	if wait := time.Until(s.notBefore); len(add) > 0 && wait > 0 {
		s.retry.Reset(wait)
		add = nil
	}
	if len(add) == 0 && len(drop) == 0 {
		return
	}
	ctx, cancel := context.WithTimeout(ctx, subscribeTimeout)
	defer cancel()

	if h.cluster == nil {
		c := s.conns[""]
		if len(drop) > 0 && c != nil {
			for _, ch := range drop {
				c.unsubscribing[ch]++
			}
			_ = c.ps.Unsubscribe(ctx, drop...)
		}
		for _, ch := range drop {
			delete(s.have, ch)
		}
		// A failed write is not fatal: go-redis keeps the channels in the
		// PubSub's set and subscribes them again when it reconnects.
		if len(add) > 0 && guard(func() {
			if c == nil {
				c = h.open(ctx, "", h.c.Subscribe(ctx))
				s.conns[""] = c
			}
			_ = c.ps.Subscribe(ctx, add...)
		}) {
			for _, ch := range add {
				s.have[ch] = c
			}
		}
		return
	}
	for _, ch := range drop {
		c := s.have[ch]
		c.unsubscribing[ch]++
		_ = c.ps.SUnsubscribe(ctx, ch)
		delete(s.have, ch)
	}
	for _, ch := range add {
		var (
			c  *conn
			ok bool
		)
		if guard(func() { c, ok = h.subscribeSharded(ctx, s.conns, ch) }) && ok {
			s.have[ch] = c
		}
	}
}

// guard turns a panic of go-redis (a client type that cannot subscribe
// without channels, say) into a failed subscription: notices are hints.
func guard(f func()) (ok bool) {
	defer func() {
		if recover() != nil {
			ok = false
		}
	}()
	f()
	return true
}

// subscribeSharded subscribes ch on the connection to the master of ch's
// slot, opening it first if needed. ok is false when the master is unknown;
// the channel is then tried again on the next change of waiters.
func (h *hub) subscribeSharded(ctx context.Context, conns map[string]*conn, ch string) (c *conn, ok bool) {
	m, err := h.cluster.MasterForKey(ctx, ch)
	if err != nil {
		return nil, false
	}
	node := m.Options().Addr
	if c := conns[node]; c != nil {
		_ = c.ps.SSubscribe(ctx, ch)
		return c, true
	}
	// ClusterClient.SSubscribe connects to the master of ch's slot.
	c = h.open(ctx, node, h.cluster.SSubscribe(ctx, ch))
	conns[node] = c
	return c, true
}

// open starts the forwarder of ps, the connection to node.
func (h *hub) open(ctx context.Context, node string, ps *goredis.PubSub) *conn {
	c := &conn{ps: ps, node: node, closing: make(chan struct{}), done: make(chan struct{}),
		unsubscribing: make(map[string]int)}
	go h.forward(context.WithoutCancel(ctx), c)
	return c
}

// forward reads c's messages until it closes. Besides each release
// notice, it passes on each confirmation of a subscription (first, or
// again after go-redis reconnected) as a wake-up: a release that happened
// while the channel was not yet (or no longer) subscribed sent its notice
// to nobody, and the waiters' retry finds the key free instead of
// sleeping out the spin. It tells run (events) when the server refused a
// command on the connection, when the connection lost a channel, and when
// a PING went unanswered.
func (h *hub) forward(ctx context.Context, c *conn) {
	defer close(c.done)
	var pinged, confirmed bool
	broken := 0 // consecutive failed reads
	for {
		msg, err := c.ps.ReceiveTimeout(ctx, healthInterval)
		select {
		case <-c.closing:
			return
		default:
		}
		if err != nil {
			var rerr goredis.Error
			var nerr net.Error
			switch {
			case errors.Is(err, goredis.ErrClosed):
				return
			case errors.As(err, &rerr):
				// A command refused: go-redis's re-subscription
				// (CROSSSLOT), a subscription to a slot that moved
				// (MOVED), an ACL (NOPERM).
				h.post(event{kind: evFailed, c: c})
				return
			case errors.As(err, &nerr) && nerr.Timeout():
				if pinged { // the PING sent a period ago is unanswered
					h.post(event{kind: evFailed, c: c})
					return
				}
				pinged = true
				pctx, cancel := context.WithTimeout(ctx, subscribeTimeout)
				_ = c.ps.Ping(pctx) // a failed write makes go-redis reconnect
				cancel()
			default:
				// The connection broke: go-redis dials again, and
				// subscribes again, on the next read. Pause between
				// failures, as go-redis's own channels do.
				if broken++; broken > 1 {
					t := time.NewTimer(retryMin)
					select {
					case <-t.C:
					case <-c.closing:
						t.Stop()
						return
					}
				}
			}
			continue
		}
		broken, pinged = 0, false
		switch m := msg.(type) {
		case *goredis.Message:
			h.notify(m.Channel, m.Payload)
		case *goredis.Subscription:
			switch m.Kind {
			case "subscribe", "ssubscribe":
				h.notify(m.Channel, "")
				if !confirmed {
					confirmed = true
					h.post(event{kind: evConfirmed, c: c})
				}
			case "unsubscribe", "sunsubscribe":
				h.post(event{kind: evDropped, c: c, channel: m.Channel})
			}
		}
	}
}
