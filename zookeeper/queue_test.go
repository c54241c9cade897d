package zookeeper

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/distlock/distlock/backend"
)

func TestParseEntry(t *testing.T) {
	const g = "_c_0123456789abcdef0123456789abcdef"
	for _, tc := range []struct {
		name  string
		kind  backend.Kind
		ok    bool
		want  backend.Kind
		limit int
	}{
		{g + "-lock-0000000007", backend.KindMutex, true, backend.KindMutex, 0},
		{"lock-0000000007", backend.KindMutex, true, backend.KindMutex, 0}, // zk.Lock's, unprotected
		{g + "-read-0000000007", backend.KindRead, true, backend.KindRead, 0},
		{g + "-write-0000000007", backend.KindWrite, true, backend.KindWrite, 0},
		{g + "-read-0000000007", backend.KindWrite, true, backend.KindRead, 0},
		{g + "-lock-0000000007", backend.KindRead, true, backend.KindWrite, 0}, // a stranger counts as a writer
		{g + "-sem3-0000000007", backend.KindSemaphore, true, backend.KindSemaphore, 3},
		{g + "-sem12-0000000007", backend.KindSemaphore, true, backend.KindSemaphore, 12},
		{g + "-sem03-0000000007", backend.KindSemaphore, true, backend.KindSemaphore, 0}, // not how we write 3
		{g + "-sem0-0000000007", backend.KindSemaphore, true, backend.KindSemaphore, 0},
		{g + "-semx-0000000007", backend.KindSemaphore, true, backend.KindSemaphore, 0},
		{g + "-lock-000000007", backend.KindMutex, false, 0, 0},
		{"parent", backend.KindMutex, false, 0, 0},
	} {
		e, ok := parseEntry(tc.name, tc.kind)
		if ok != tc.ok || (ok && (e.kind != tc.want || e.limit != tc.limit || e.seq != 7)) {
			t.Errorf("parseEntry(%q, %v) = %+v, %v; want kind %v, limit %d, seq 7, %v", tc.name, tc.kind, e, ok, tc.want, tc.limit, tc.ok)
		}
	}
	for _, kind := range []backend.Kind{backend.KindMutex, backend.KindRead, backend.KindWrite, backend.KindSemaphore} {
		l := &backend.Lease{Kind: kind, Limit: 5}
		name := g + "-" + tagOf(l) + "-0000000001"
		e, ok := parseEntry(name, kind)
		if !ok || e.kind != kind || (kind == backend.KindSemaphore) != (e.limit == 5) {
			t.Errorf("parseEntry of our own %v child %q = %+v, %v", kind, name, e, ok)
		}
	}
}

// TestSequenceWrap: ZooKeeper's sequence counter is a signed
// 32-bit number, written with "%010d", that goes negative after 2^31-1
// creates under one parent. Names across the wrap parse, keep their tag,
// and order as they were made. (A real server would need 2^31 creates
// under one parent to show it: these are the names its documentation
// gives.) Before, "-2147483647" read as 2147483647 and the children made
// after the wrap sorted before the older ones: two holders at once.
func TestSequenceWrap(t *testing.T) {
	const g = "_c_0123456789abcdef0123456789abcdef-sem2-"
	made := []struct {
		suffix string
		seq    int64
	}{
		{"0000000007", 7}, {"1000000000", 1000000000}, {"2147483646", 2147483646}, {"2147483647", 2147483647},
		{"-2147483648", -2147483648}, {"-2147483647", -2147483647}, {"-1000000000", -1000000000},
		{"-999999999", -999999999}, {"-000000001", -1}, {"0000000000", 0}, {"0000000001", 1},
	}
	var names []string
	for _, m := range made {
		name := g + m.suffix
		seq, n, ok := sequence(name)
		if !ok || int32(seq) != int32(m.seq) || n != len(m.suffix) {
			t.Errorf("sequence(%q) = %d, %d, %v; want %d, %d", name, int32(seq), n, ok, m.seq, len(m.suffix))
		}
		e, ok := parseEntry(name, backend.KindSemaphore)
		if !ok || e.limit != 2 {
			t.Errorf("parseEntry(%q) = %+v, %v; want a permit of limit 2", name, e, ok)
		}
		names = append(names, name)
	}
	// Children alive at once span fewer than 2^31 creates: each window of
	// the names above that does, listed backwards, comes back in order.
	for lo := range names {
		for hi := lo + 1; hi <= len(names); hi++ {
			if uint32(made[hi-1].seq)-uint32(made[lo].seq) >= 1<<31 {
				continue // not alive at once
			}
			window := slices.Clone(names[lo:hi])
			slices.Reverse(window)
			for i, e := range queueOf(window, backend.KindSemaphore) {
				if e.name != names[lo+i] {
					t.Fatalf("queueOf(%v)[%d] = %s; want %s", window, i, e.name, names[lo+i])
				}
			}
		}
	}
	for _, bad := range []string{g + "2147483648", g[:len(g)-1] + "-2147483648", g + "-000000000", g + "x000000001", "-2147483649", g + "99999999999"} {
		if seq, n, ok := sequence(bad); ok {
			t.Errorf("sequence(%q) = %d, %d, ok; want not", bad, seq, n)
		}
	}
}

// q builds a queue from specs: "r", "w", "m" (mutex), or a semaphore
// limit as a number.
func q(specs ...any) []entry {
	out := make([]entry, len(specs))
	for i, s := range specs {
		e := entry{name: fmt.Sprint("c", i), seq: uint32(i)}
		switch s {
		case "r":
			e.kind = backend.KindRead
		case "w":
			e.kind = backend.KindWrite
		case "m":
			e.kind = backend.KindMutex
		default:
			e.kind, e.limit = backend.KindSemaphore, s.(int)
		}
		out[i] = e
	}
	return out
}

func TestJudge(t *testing.T) {
	for _, tc := range []struct {
		q     []entry
		i     int
		kind  backend.Kind
		limit int
		want  verdict
	}{
		{q("m"), 0, backend.KindMutex, 0, verdict{hold: true}},
		{q("m", "m", "m"), 2, backend.KindMutex, 0, verdict{watch: "c1"}},
		{q("m", "m"), 1, backend.KindMutex, 0, verdict{watch: "c0", alone: true}},
		{q("r", "r", "r"), 2, backend.KindRead, 0, verdict{hold: true}},
		{q("w", "r", "r"), 2, backend.KindRead, 0, verdict{watch: "c0", alone: true}},
		{q("r", "w", "r", "w", "r", "r"), 5, backend.KindRead, 0, verdict{watch: "c3"}}, // the last writer before it
		{q("r", "r", "w", "r"), 3, backend.KindRead, 0, verdict{watch: "c2", alone: true}},
		{q("r", "r", "w"), 2, backend.KindWrite, 0, verdict{watch: "c1"}},
		{q("w"), 0, backend.KindWrite, 0, verdict{hold: true}},
		{q(3, 3, 3), 2, backend.KindSemaphore, 3, verdict{hold: true}},
		{q(3, 3, 3, 3), 3, backend.KindSemaphore, 3, verdict{children: true}},               // the first waiter: any change
		{q(3, 3, 3, 3, 3), 4, backend.KindSemaphore, 3, verdict{watch: "c3", signal: true}}, // behind it: its grant
		{q(1, 1), 1, backend.KindSemaphore, 1, verdict{watch: "c0", alone: true}},           // limit 1: a mutex
		{q(1, 1, 1), 2, backend.KindSemaphore, 1, verdict{watch: "c1"}},
		{q(2, 3), 1, backend.KindSemaphore, 3, verdict{mismatch: true}},
		{q(3, 2, 3), 2, backend.KindSemaphore, 3, verdict{mismatch: true}}, // any child before it
		{q(3, 3, 2), 1, backend.KindSemaphore, 3, verdict{hold: true}},     // not one behind it
		{q(0, 3), 1, backend.KindSemaphore, 3, verdict{mismatch: true}},    // unreadable: not one of ours
	} {
		if got := judge(tc.q, tc.i, tc.kind, tc.limit); got != tc.want {
			t.Errorf("judge(%v, %d, %v, %d) = %+v; want %+v", tc.q, tc.i, tc.kind, tc.limit, got, tc.want)
		}
	}
}

// TestHolders: Inspect lists exactly the children that judge grants.
func TestHolders(t *testing.T) {
	rnd := rand.New(rand.NewPCG(1, 2))
	for range 2000 {
		n := rnd.IntN(8)
		var specs []any
		kind := []backend.Kind{backend.KindMutex, backend.KindWrite, backend.KindSemaphore}[rnd.IntN(3)]
		for range n {
			switch kind {
			case backend.KindMutex:
				specs = append(specs, "m")
			case backend.KindWrite:
				specs = append(specs, []string{"r", "w"}[rnd.IntN(2)])
			default:
				specs = append(specs, 1+rnd.IntN(3))
			}
		}
		qq := q(specs...)
		var want []int
		for i, e := range qq {
			k, limit := e.kind, e.limit
			if judge(qq, i, k, limit).hold {
				want = append(want, i)
			}
		}
		if got := holders(qq, kind); !slices.Equal(got, want) {
			t.Fatalf("holders(%v) = %v; want %v (judge's)", specs, got, want)
		}
	}
}

// TestQueueModel runs the waiting rules against a model of the queue, with
// arrivals, releases and give-ups in random order, and the waiters'
// reactions (a listing after a watch fired) delayed and interleaved at
// random, as the network does. A listing sees the queue as it is then;
// a watch fires on the change it watches (a deletion, a grant's mark,
// any change of the queue for a child watch); the deletion of the only
// child a waiter waited for grants it with no listing. Invariants:
//
//   - safety: the clients that believe they hold never exceed what the
//     kind allows (one writer or mutex holder, or readers only; at most
//     limit permits, all of one limit);
//   - liveness: whenever no reaction is pending, every child the queue
//     grants has been told so, so that no permit stays idle while a
//     waiter sleeps;
//   - the queue grants a prefix of itself: the store grants in queue
//     order, so czxids rise with its grants (a client may learn of its
//     grant after one behind it learned of its own).
func TestQueueModel(t *testing.T) {
	seed := randomSeed(t)
	t.Logf("seed %d (DISTLOCK_SEED=%d reruns it)", seed, seed)
	rnd := rand.New(rand.NewPCG(seed, 3))
	for _, tc := range []struct {
		name   string
		kind   backend.Kind
		limits []int // a semaphore's: the limits arrivals ask for
	}{
		{"Mutex", backend.KindMutex, nil},
		{"RWMutex", backend.KindWrite, nil},
		{"Semaphore1", backend.KindSemaphore, []int{1}},
		{"Semaphore2", backend.KindSemaphore, []int{2}},
		{"Semaphore3", backend.KindSemaphore, []int{3}},
		{"Semaphore5", backend.KindSemaphore, []int{5}},
		{"SemaphoreMixed", backend.KindSemaphore, []int{2, 2, 2, 3}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			for run := range 200 {
				m := &queueModel{t: t, rnd: rnd, kind: tc.kind, limits: tc.limits}
				m.run(400)
				if t.Failed() {
					t.Fatalf("run %d failed", run)
				}
			}
		})
	}
}

type modelClient struct {
	e        entry
	asked    backend.Kind
	state    int // waiting, holding
	watch    string
	children bool
	signal   bool
	alone    bool // its watched child's deletion grants it
	marked   bool // its grant's mark (a data change) is written
}

const (
	waiting = iota
	holding
)

type queueModel struct {
	t       *testing.T
	rnd     *rand.Rand
	kind    backend.Kind
	limits  []int
	seq     uint32
	clients []*modelClient // in queue order; removed when their child goes
	pending []func()       // reactions not yet made, made in random order
}

func (m *queueModel) queue() []entry {
	q := make([]entry, len(m.clients))
	for i, c := range m.clients {
		q[i] = c.e
	}
	return q
}

func (m *queueModel) index(c *modelClient) int { return slices.Index(m.clients, c) }

// list is a client's listing and what it does with it.
func (m *queueModel) list(c *modelClient) {
	i := m.index(c)
	if i < 0 || c.state == holding {
		return
	}
	q := m.queue()
	v := judge(q, i, c.asked, c.e.limit)
	switch {
	case v.mismatch:
		m.remove(c)
	case v.hold:
		c.state = holding
		if grantSignal(q, i, c.asked, c.e.limit) {
			m.pending = append(m.pending, func() { m.mark(c) })
		}
	default:
		c.watch, c.children, c.signal, c.alone = v.watch, v.children, v.signal, v.alone
		if v.signal {
			if p := m.byName(v.watch); p != nil && p.marked {
				m.pending = append(m.pending, func() { m.list(c) })
			}
		}
	}
}

func (m *queueModel) byName(name string) *modelClient {
	for _, c := range m.clients {
		if c.e.name == name {
			return c
		}
	}
	return nil
}

// mark is a holder's grant mark landing: the data watches on it fire.
func (m *queueModel) mark(c *modelClient) {
	if m.index(c) < 0 {
		return
	}
	c.marked = true
	for _, w := range m.clients {
		if w.state == waiting && w.watch == c.e.name {
			w.watch = ""
			m.pending = append(m.pending, func() { m.list(w) })
		}
	}
}

// changed fires the watches a change of the queue fires: child watches,
// and the watches on the child removed (if any).
func (m *queueModel) changed(removed string) {
	for _, w := range m.clients {
		if w.state != waiting {
			continue
		}
		switch {
		case removed != "" && w.watch == removed && w.alone:
			// The deletion of the only child before it: held, with no
			// listing.
			w.watch = ""
			m.pending = append(m.pending, func() {
				if m.index(w) >= 0 {
					w.state = holding
				}
			})
		case w.children || (removed != "" && w.watch == removed):
			w.children, w.watch = false, ""
			m.pending = append(m.pending, func() { m.list(w) })
		}
	}
}

func (m *queueModel) remove(c *modelClient) {
	i := m.index(c)
	if i < 0 {
		return
	}
	m.clients = slices.Delete(m.clients, i, i+1)
	m.changed(c.e.name)
}

func (m *queueModel) arrive() {
	c := &modelClient{}
	m.seq++
	c.e = entry{name: fmt.Sprint("c", m.seq), seq: m.seq}
	switch m.kind {
	case backend.KindWrite:
		c.asked = []backend.Kind{backend.KindRead, backend.KindWrite}[m.rnd.IntN(2)]
		c.e.kind = c.asked
	case backend.KindSemaphore:
		c.asked = backend.KindSemaphore
		c.e.kind, c.e.limit = c.asked, m.limits[m.rnd.IntN(len(m.limits))]
	default:
		c.asked, c.e.kind = backend.KindMutex, backend.KindMutex
	}
	m.clients = append(m.clients, c)
	m.changed("")
	m.pending = append(m.pending, func() { m.list(c) })
}

func (m *queueModel) run(steps int) {
	for range steps {
		switch r := m.rnd.IntN(10); {
		case r < 3 && len(m.pending) > 0, r < 7 && len(m.pending) > 3:
			i := m.rnd.IntN(len(m.pending))
			f := m.pending[i]
			m.pending = slices.Delete(m.pending, i, i+1)
			f()
		case r < 8 || len(m.clients) == 0:
			if len(m.clients) < 12 {
				m.arrive()
			}
		default:
			// A release, or a waiter giving up.
			m.remove(m.clients[m.rnd.IntN(len(m.clients))])
		}
		m.check()
		if len(m.pending) == 0 {
			m.checkLive()
		}
		if m.t.Failed() {
			return
		}
	}
	for len(m.pending) > 0 {
		f := m.pending[0]
		m.pending = m.pending[1:]
		f()
		m.check()
	}
	m.checkLive()
}

// check: the believers are what the kind allows.
func (m *queueModel) check() {
	var holders []*modelClient
	for _, c := range m.clients {
		if c.state == holding {
			holders = append(holders, c)
		}
	}
	switch m.kind {
	case backend.KindSemaphore:
		for _, h := range holders {
			if h.e.limit != holders[0].e.limit || len(holders) > h.e.limit {
				m.t.Errorf("%d holders of a semaphore, limits %v", len(holders), limitsOf(holders))
				return
			}
		}
	case backend.KindWrite:
		for _, h := range holders {
			if h.asked == backend.KindWrite && len(holders) > 1 {
				m.t.Errorf("a writer holds with %d others", len(holders)-1)
				return
			}
		}
	default:
		if len(holders) > 1 {
			m.t.Errorf("%d holders of a mutex", len(holders))
		}
	}
	// The queue grants a prefix of itself: the store grants in queue
	// order, so that czxids rise with its grants.
	q := m.queue()
	for i := 1; i < len(q); i++ {
		if judge(q, i, m.clients[i].asked, q[i].limit).hold && !judge(q, i-1, m.clients[i-1].asked, q[i-1].limit).hold {
			m.t.Errorf("the queue %v grants %s, not %s before it", q, q[i].name, q[i-1].name)
			return
		}
	}
}

func limitsOf(cs []*modelClient) []int {
	var out []int
	for _, c := range cs {
		out = append(out, c.e.limit)
	}
	return out
}

// checkLive: with no reaction pending, every child the queue grants knows.
func (m *queueModel) checkLive() {
	q := m.queue()
	for i, c := range m.clients {
		if c.state == waiting && judge(q, i, c.asked, c.e.limit).hold {
			m.t.Errorf("%s is granted by the queue %v but waits (watch %q, children %v)", c.e.name, q, c.watch, c.children)
		}
	}
}
