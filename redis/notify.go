package redis

import (
	"context"
	"sync"
	"time"

	goredis "github.com/redis/go-redis/v9"
)

// subscribeTimeout bounds one SUBSCRIBE/UNSUBSCRIBE write (and the dial
// before it) made by the hub's goroutine.
const subscribeTimeout = 5 * time.Second

// hub is a Resource's release-notice fan-out. Waiters register per channel
// under mu; one goroutine (run) owns the subscriptions and reconciles what
// Redis is subscribed to with what waiters want, so subscribe and
// unsubscribe commands for one channel can never reorder. One forwarding
// goroutine per PubSub connection passes each notice to the waiters.
type hub struct {
	c       goredis.UniversalClient
	cluster *goredis.ClusterClient

	mu      sync.Mutex
	waiters map[string]map[*waiter]struct{} // channel -> waiters; no empty sets
	started bool
	closed  bool

	kick chan struct{} // buffered 1: waiters changed
	stop context.CancelFunc
	done chan struct{} // closed when run and every forwarder returned
}

type waiter struct {
	ch chan struct{}
}

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

// subscribe registers a waiter for channel and, when it is the first,
// asks the goroutine to subscribe. It does no I/O itself.
func (h *hub) subscribe(channel string) (<-chan struct{}, func()) {
	w := &waiter{ch: make(chan struct{}, 1)}
	h.mu.Lock()
	if h.closed {
		h.mu.Unlock()
		return nil, func() {}
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
				if !h.closed {
					h.poke()
				}
			}
		})
	}
}

// notify wakes every waiter of channel without blocking.
func (h *hub) notify(channel string) {
	h.mu.Lock()
	for w := range h.waiters[channel] {
		select {
		case w.ch <- struct{}{}:
		default:
		}
	}
	h.mu.Unlock()
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
	ps   *goredis.PubSub
	done chan struct{} // closed when the forwarder returned
}

// run owns the subscriptions: on every kick it subscribes the channels
// waiters want and unsubscribes the ones nobody waits for any more.
func (h *hub) run(ctx context.Context) {
	defer close(h.done)
	var (
		conns = make(map[string]*conn)  // by node address; "" outside Cluster
		have  = make(map[string]string) // subscribed channel -> conns key
	)
	defer func() {
		for _, c := range conns {
			_ = c.ps.Close()
			<-c.done
		}
	}()
	for {
		select {
		case <-ctx.Done():
			return
		case <-h.kick:
		}
		h.reconcile(ctx, conns, have)
	}
}

// reconcile subscribes the channels waiters want and unsubscribes the
// ones nobody waits for any more. Outside Cluster each direction is one
// command; on Cluster one per channel (SSUBSCRIBE takes one slot at a time).
func (h *hub) reconcile(ctx context.Context, conns map[string]*conn, have map[string]string) {
	var add, drop []string
	h.mu.Lock()
	for ch := range h.waiters {
		if _, ok := have[ch]; !ok {
			add = append(add, ch)
		}
	}
	for ch := range have {
		if _, ok := h.waiters[ch]; !ok {
			drop = append(drop, ch)
		}
	}
	h.mu.Unlock()
	if len(add) == 0 && len(drop) == 0 {
		return
	}
	ctx, cancel := context.WithTimeout(ctx, subscribeTimeout)
	defer cancel()

	if h.cluster == nil {
		c := conns[""]
		if len(drop) > 0 && c != nil {
			_ = c.ps.Unsubscribe(ctx, drop...)
		}
		for _, ch := range drop {
			delete(have, ch)
		}
		// A failed write is not fatal: go-redis keeps the channels in the
		// PubSub's set and subscribes them again when it reconnects.
		if len(add) > 0 && guard(func() {
			if c == nil {
				c = h.open(h.c.Subscribe(ctx))
				conns[""] = c
			}
			_ = c.ps.Subscribe(ctx, add...)
		}) {
			for _, ch := range add {
				have[ch] = ""
			}
		}
		return
	}
	for _, ch := range drop {
		_ = conns[have[ch]].ps.SUnsubscribe(ctx, ch)
		delete(have, ch)
	}
	for _, ch := range add {
		var (
			node string
			ok   bool
		)
		if guard(func() { node, ok = h.subscribeSharded(ctx, conns, ch) }) && ok {
			have[ch] = node
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
func (h *hub) subscribeSharded(ctx context.Context, conns map[string]*conn, ch string) (node string, ok bool) {
	m, err := h.cluster.MasterForKey(ctx, ch)
	if err != nil {
		return "", false
	}
	node = m.Options().Addr
	if c := conns[node]; c != nil {
		_ = c.ps.SSubscribe(ctx, ch)
		return node, true
	}
	// ClusterClient.SSubscribe connects to the master of ch's slot.
	conns[node] = h.open(h.cluster.SSubscribe(ctx, ch))
	return node, true
}

// open starts the forwarder of ps. Besides each release notice, it passes
// on each confirmation of a subscription (first, or again after go-redis
// reconnected) as a wake-up: a release that happened while the channel was
// not yet (or no longer) subscribed sent its notice to nobody, and the
// waiters' retry finds the key free instead of sleeping out the spin.
func (h *hub) open(ps *goredis.PubSub) *conn {
	c := &conn{ps: ps, done: make(chan struct{})}
	msgs := ps.ChannelWithSubscriptions()
	go func() {
		defer close(c.done)
		for m := range msgs {
			switch m := m.(type) {
			case *goredis.Message:
				h.notify(m.Channel)
			case *goredis.Subscription:
				if m.Kind == "subscribe" || m.Kind == "ssubscribe" {
					h.notify(m.Channel)
				}
			}
		}
	}()
	return c
}
