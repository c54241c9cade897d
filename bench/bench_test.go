package main

import (
	"encoding/xml"
	"errors"
	"io"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/distlock/distlock"
)

func TestMedian(t *testing.T) {
	for _, c := range []struct {
		in   []float64
		want float64
	}{
		{[]float64{3, 1, 2}, 2},
		{[]float64{4, 1, 3, 2}, 2.5},
		{[]float64{7}, 7},
	} {
		if got := median(c.in); got != c.want {
			t.Errorf("median(%v) = %v; want %v", c.in, got, c.want)
		}
	}
	if got := median(nil); !math.IsNaN(got) {
		t.Errorf("median(nil) = %v; want NaN", got)
	}
}

func TestQuantile(t *testing.T) {
	var d []time.Duration
	for i := 1; i <= 100; i++ {
		d = append(d, time.Duration(i))
	}
	for _, c := range []struct {
		q    float64
		want time.Duration
	}{{0.5, 50}, {0.99, 99}, {1, 100}, {0, 1}} {
		if got := quantile(d, c.q); got != c.want {
			t.Errorf("quantile(1..100, %v) = %v; want %v", c.q, got, c.want)
		}
	}
	if got := quantile(nil, 0.5); got != 0 {
		t.Errorf("quantile(nil) = %v; want 0", got)
	}
}

func TestSumMetric(t *testing.T) {
	text := `# HELP grpc_server_msg_received_total x
grpc_server_msg_received_total{grpc_method="Range",grpc_service="etcdserverpb.KV",grpc_type="unary"} 10
grpc_server_msg_received_total{grpc_method="Txn",grpc_service="etcdserverpb.KV",grpc_type="unary"} 2.5e+01
grpc_server_msg_received_totalx 100
grpc_server_msg_sent_total{grpc_method="Txn"} 7
`
	got, err := sumMetric(strings.NewReader(text), "grpc_server_msg_received_total")
	if err != nil || got != 35 {
		t.Errorf("sumMetric = %v, %v; want 35, nil", got, err)
	}
	if _, err := sumMetric(strings.NewReader(text), "absent_total"); err == nil {
		t.Error("sumMetric of an absent metric: no error")
	}
}

func TestKeyName(t *testing.T) {
	if got, want := keyName("a b", "c/d", "E-9"), "a-b-c-d-E-9"; got != want {
		t.Errorf("keyName = %q; want %q", got, want)
	}
}

func TestChartIsSVG(t *testing.T) {
	svg := chart([]bar{
		{group: "g1", label: "redis: a / b", ratio: 0.93},
		{group: "g2", label: "etcd: <c> & d", ratio: 95},
		{group: "g1", label: "zk: e / f", ratio: math.NaN()},
	})
	dec := xml.NewDecoder(strings.NewReader(svg))
	for {
		_, err := dec.Token()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatalf("chart is not well-formed XML: %v\n%s", err, svg)
		}
	}
	for _, want := range []string{"0.93x", "95.00x (cut)", "n/a", "&lt;c&gt; &amp; d"} {
		if !strings.Contains(svg, want) {
			t.Errorf("chart lacks %q", want)
		}
	}
	// g1's bars come together, before g2's.
	if i, j := strings.Index(svg, "zk: e / f"), strings.Index(svg, "etcd: "); i > j {
		t.Errorf("bars of one group are not together: zk at %d, etcd at %d", i, j)
	}
}

func TestOrderAlternates(t *testing.T) {
	xs := []string{"a", "b", "c"}
	if got := strings.Join(order(xs, 0), ""); got != "abc" {
		t.Errorf("round 0: %s", got)
	}
	if got := strings.Join(order(xs, 1), ""); got != "cba" {
		t.Errorf("round 1: %s", got)
	}
	if strings.Join(xs, "") != "abc" {
		t.Error("order changed its input")
	}
}

var goodKinds = kindsConfig{rounds: 3, slice: time.Second, hold: time.Millisecond, wait: time.Second, limit: 3, readShare: 0.9}

func TestValidate(t *testing.T) {
	good := config{workloads: []string{"uncontended"}, rounds: 3, contendedRounds: 1, slice: time.Second,
		parallel: 16, instances: 3, workers: 4, handoffs: 10, ttl: time.Second, retry: time.Millisecond,
		scaleLocks: 1, scaleRounds: 1, scaleGoroutines: 1, scaleTTL: time.Second, scaleWindow: time.Second}
	if err := good.validate(); err != nil {
		t.Fatalf("good config: %v", err)
	}
	kinds := good
	kinds.workloads, kinds.kinds = []string{wlSemaphore, wlReadMostly}, goodKinds
	if err := kinds.validate(); err != nil {
		t.Fatalf("good kinds config: %v", err)
	}
	for name, f := range map[string]func(*config){
		"unknown workload":  func(c *config) { c.workloads = []string{"nope"} },
		"zero rounds":       func(c *config) { c.rounds = 0 },
		"zero scale rounds": func(c *config) { c.scaleRounds = 0 },
		"zero slice":        func(c *config) { c.slice = 0 },
		"negative jitter":   func(c *config) { c.jitter = -1 },
		"bad cpu":           func(c *config) { c.cpu = -1 },
		"semaphore, no kinds rounds": func(c *config) {
			c.workloads, c.kinds = []string{wlSemaphore}, goodKinds
			c.kinds.rounds = 0
		},
		"semaphore, limit 0": func(c *config) {
			c.workloads, c.kinds = []string{wlSemaphore}, goodKinds
			c.kinds.limit = 0
		},
		"read-mostly, share over 1": func(c *config) {
			c.workloads, c.kinds = []string{wlReadMostly}, goodKinds
			c.kinds.readShare = 1.5
		},
	} {
		c := good
		f(&c)
		if err := c.validate(); err == nil {
			t.Errorf("%s: no error", name)
		}
	}
}

func TestSectionID(t *testing.T) {
	for _, c := range []struct{ sec, want string }{
		{"### Uncontended: redis (pinned: client and server threads on CPU 0, GOMAXPROCS 1)\n\nx", "uncontended/redis"},
		{"### Parallel: etcd (16 goroutines, distinct keys, not pinned)\n", "parallel/etcd/16"},
		{"### Parallel: redis (64 goroutines, distinct keys, not pinned)\n", "parallel/redis/64"},
		{"### Contended: postgres\n", "contended/postgres"},
		{"### Handoff: zookeeper\n", "handoff/zookeeper"},
		{"### Scale: redis, 10000 locks held at once by one process\n", "scale/redis/held/10000"},
		{"### Scale: memory, 100000 locks held at once by one process\n", "scale/memory/held/100000"},
		{"### Scale: etcd, 1000 goroutines on one key\n", "scale/etcd/hotkey"},
		{"### Semaphore: redis (limit 3, 3 instances x 4 goroutines)\n", "semaphore/redis"},
		{"### Read-mostly: postgres (90% reads, 3 instances x 4 goroutines)\n", "read-mostly/postgres"},
		{"### Left out\n\n- x\n", "left out"},
	} {
		if got := sectionID(c.sec); got != c.want {
			t.Errorf("sectionID(%q) = %q; want %q", c.sec, got, c.want)
		}
	}
}

// A run of the scale workload on some stores replaces those stores'
// scale tables in RESULTS.md, adds the ones it lacks after the other
// scale tables, and keeps the rest byte for byte.
func TestMergeSections(t *testing.T) {
	old := "# head\n\n## Targets\n\n| a | b |\n\n" +
		"### Uncontended: redis (pinned)\n\nold uncontended\n\n" +
		"### Scale: redis, 10000 locks held at once by one process\n\nold redis held\n\n" +
		"### Scale: redis, 1000 goroutines on one key\n\nold redis hot\n\n" +
		"### Scale: etcd, 10000 locks held at once by one process\n\nold etcd held\n\n" +
		"### Left out\n\n- nothing\n\n"
	sec := func(w, text string) *section {
		s := &section{workload: w}
		s.b.WriteString(text)
		return s
	}
	fresh := []*section{
		sec("scale", "### Scale: memory, 100000 locks held at once by one process\n\nnew memory held\n\n"),
		sec("scale", "### Scale: redis, 10000 locks held at once by one process\n\nnew redis held\n\n"),
		sec("scale", "### Scale: redis, 1000 goroutines on one key\n\nnew redis hot\n\n"),
	}
	got := mergeSections(old, fresh, "(run)")
	want := "# head\n\n## Targets\n\n| a | b |\n\n" +
		"### Uncontended: redis (pinned)\n\nold uncontended\n\n" +
		"### Scale: redis, 10000 locks held at once by one process\n\n(run)\n\nnew redis held\n\n" +
		"### Scale: redis, 1000 goroutines on one key\n\n(run)\n\nnew redis hot\n\n" +
		"### Scale: etcd, 10000 locks held at once by one process\n\nold etcd held\n\n" +
		"### Scale: memory, 100000 locks held at once by one process\n\n(run)\n\nnew memory held\n\n" +
		"### Left out\n\n- nothing\n\n"
	if got != want {
		t.Errorf("merged:\n%s\nwant:\n%s", got, want)
	}
	// A file without the workload's tables gets them before "Left out".
	got = mergeSections("# head\n\n### Handoff: redis\n\nh\n\n### Left out\n\n- x\n", fresh[1:2], "(run)")
	if want := "# head\n\n### Handoff: redis\n\nh\n\n### Scale: redis, 10000 locks held at once by one process\n\n(run)\n\nnew redis held\n\n### Left out\n\n- x\n"; got != want {
		t.Errorf("merged into a file without scale tables:\n%s\nwant:\n%s", got, want)
	}
}

func TestHeldTargets(t *testing.T) {
	cfg := config{scaleLocks: 100_000, scaleTTL: 6 * time.Second}
	dl := &peer{name: "distlock", renewal: "auto"}
	native := &peer{name: "redislock"}
	rs := []heldResult{
		{p: native, n: 100_000, acquire: 2 * time.Second, window: 4 * time.Second},
		// 100,000 locks renewed every 2s in batches of 500: 200 requests
		// per interval, 100 per second.
		{p: dl, n: 100_000, acquire: time.Second, window: 4 * time.Second, requests: 400, bytesPerLock: 250},
	}
	ts := heldTargets(cfg, "redis", rs)
	if len(ts) != 4 {
		t.Fatalf("%d targets; want 4: %+v", len(ts), ts)
	}
	for _, tg := range ts {
		if !tg.ok || !tg.known {
			t.Errorf("%s: %s: ok %v, known %v; want met", tg.what, tg.got, tg.ok, tg.known)
		}
	}
	if x := requestsPer500(rs[1], 2*time.Second); x != 1 {
		t.Errorf("requestsPer500 = %v; want 1", x)
	}
	// Twice the requests, twice the heap, slower than the native peer:
	// every target but the 0 lost is missed; at 10,000 locks the size is
	// not the target's.
	rs[1].requests, rs[1].bytesPerLock, rs[1].acquire = 800, 600, 3*time.Second
	cfg.scaleLocks = 10_000
	for i, tg := range heldTargets(cfg, "redis", rs) {
		if i == 0 && tg.known {
			t.Errorf("%s at 10,000 locks: known; want not the target's size", tg.what)
		}
		if i > 0 && tg.ok {
			t.Errorf("%s: %s met; want missed", tg.what, tg.got)
		}
	}
	// Over rounds (-scale-rounds), the acquire target is the median of
	// the rounds' ratios, not the ratio of the rows' times.
	rs[1].ratios = []float64{0.8, 1.5, 0.9}
	ts = heldTargets(cfg, "redis", rs)
	if tg := ts[len(ts)-1]; !tg.ok || !strings.Contains(tg.got, "0.90x") || !strings.Contains(tg.got, "0.80-1.50") {
		t.Errorf("%s: %s, ok %v; want met at the median 0.90x, range 0.80-1.50", tg.what, tg.got, tg.ok)
	}
}

// The guard counts a grant that breaks the rule: a permit over the
// limit, a writer with anyone, a reader with a writer.
func TestGuardCountsViolations(t *testing.T) {
	g := &guard{limit: 2}
	g.enter(distlock.KindSemaphore)
	g.enter(distlock.KindSemaphore)
	if g.violations != 0 || g.most != 2 {
		t.Fatalf("two permits of limit 2: violations %d, most %d; want 0, 2", g.violations, g.most)
	}
	g.enter(distlock.KindSemaphore)
	if g.violations != 1 {
		t.Errorf("third permit of limit 2: violations %d; want 1", g.violations)
	}
	rw := &guard{}
	rw.enter(distlock.KindRead)
	rw.enter(distlock.KindRead)
	if rw.violations != 0 || rw.most != 2 {
		t.Fatalf("two readers: violations %d, most %d; want 0, 2", rw.violations, rw.most)
	}
	rw.enter(distlock.KindWrite)
	rw.leave(distlock.KindRead)
	rw.leave(distlock.KindRead)
	rw.enter(distlock.KindRead)
	if rw.violations != 2 {
		t.Errorf("a writer with readers, then a reader with the writer: violations %d; want 2", rw.violations)
	}
}
