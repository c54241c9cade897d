package main

import (
	"encoding/xml"
	"errors"
	"io"
	"math"
	"strings"
	"testing"
	"time"
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

func TestValidate(t *testing.T) {
	good := config{workloads: []string{"uncontended"}, rounds: 3, contendedRounds: 1, slice: time.Second,
		parallel: 16, instances: 3, workers: 4, handoffs: 10, ttl: time.Second, retry: time.Millisecond,
		scaleLocks: 1, scaleGoroutines: 1, scaleTTL: time.Second, scaleWindow: time.Second}
	if err := good.validate(); err != nil {
		t.Fatalf("good config: %v", err)
	}
	for name, f := range map[string]func(*config){
		"unknown workload": func(c *config) { c.workloads = []string{"nope"} },
		"zero rounds":      func(c *config) { c.rounds = 0 },
		"zero slice":       func(c *config) { c.slice = 0 },
		"negative jitter":  func(c *config) { c.jitter = -1 },
		"bad cpu":          func(c *config) { c.cpu = -1 },
	} {
		c := good
		f(&c)
		if err := c.validate(); err == nil {
			t.Errorf("%s: no error", name)
		}
	}
}
