package zookeeper

import (
	"io"
	"net"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/distlock/distlock"
	"github.com/distlock/distlock/internal/testserver"
	"github.com/distlock/distlock/testsuite"
)

// packets returns the requests the server at addr has received (mntr
// zk_packets_received: every request, session pings included).
func packets(b testing.TB, addr string) int64 {
	b.Helper()
	c, err := net.DialTimeout("tcp", addr, time.Second)
	if err != nil {
		b.Fatal(err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(time.Second))
	if _, err := io.WriteString(c, "mntr"); err != nil {
		b.Fatal(err)
	}
	out, err := io.ReadAll(c)
	if err != nil {
		b.Fatal(err)
	}
	for line := range strings.SplitSeq(string(out), "\n") {
		if v, ok := strings.CutPrefix(line, "zk_packets_received"); ok {
			n, err := strconv.ParseInt(strings.TrimSpace(v), 10, 64)
			if err != nil {
				b.Fatalf("mntr: %q: %v", line, err)
			}
			return n
		}
	}
	b.Fatalf("mntr: no zk_packets_received in %q", out)
	return 0
}

// reportPackets reports the packets received since before, per op.
func reportPackets(b *testing.B, addr string, before int64) {
	b.ReportMetric(float64(packets(b, addr)-before)/float64(b.N), "packets/op")
}

// BenchmarkContended is the seed workload's shape: 3 instances (each a
// DistributeLock over a connection of its own, as processes would have) x
// 4 goroutines take one key in turn. One op is one successful TryLock +
// Unlock; packets/op counts the requests the server received per op.
func BenchmarkContended(b *testing.B) {
	addr := testserver.ZooKeeper(b).Addr
	var ds []*distlock.DistributeLock
	for range 3 {
		ds = append(ds, newBenchLock(b, []string{addr}))
	}
	key := uniqueKey(b)
	before := packets(b, addr)
	testsuite.Contend(b, ds, key, 12)
	reportPackets(b, addr, before)
}
