package etcd

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	"google.golang.org/grpc"

	"github.com/distlock/distlock"
	"github.com/distlock/distlock/internal/testserver"
	"github.com/distlock/distlock/testsuite"
)

// countingClient returns a client whose requests are counted in n: one per
// unary call, one per message sent on a stream (a watch request, a lease
// keep-alive).
func countingClient(b testing.TB, endpoints []string, n *atomic.Int64) *clientv3.Client {
	unary := func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
		n.Add(1)
		return invoker(ctx, method, req, reply, cc, opts...)
	}
	stream := func(ctx context.Context, desc *grpc.StreamDesc, cc *grpc.ClientConn, method string, streamer grpc.Streamer, opts ...grpc.CallOption) (grpc.ClientStream, error) {
		s, err := streamer(ctx, desc, cc, method, opts...)
		return countingStream{s, n}, err
	}
	c, err := clientv3.New(clientv3.Config{Endpoints: endpoints, DialTimeout: 5 * time.Second, Logger: zap.NewNop(),
		DialOptions: []grpc.DialOption{grpc.WithChainUnaryInterceptor(unary), grpc.WithChainStreamInterceptor(stream)}})
	if err != nil {
		b.Fatalf("clientv3.New: %v", err)
	}
	b.Cleanup(func() { c.Close() })
	return c
}

type countingStream struct {
	grpc.ClientStream
	n *atomic.Int64
}

func (s countingStream) SendMsg(m any) error {
	s.n.Add(1)
	return s.ClientStream.SendMsg(m)
}

// BenchmarkContended is the seed workload's shape: 3 instances (each a
// DistributeLock over a client of its own, as processes would have) x 4
// goroutines take one key in turn. One op is one successful TryLock +
// Unlock; rpcs/op counts the requests the clients sent per op (acquires,
// watches, reads, keep-alives, releases).
func BenchmarkContended(b *testing.B) {
	endpoints := testserver.Etcd(b).Endpoints
	for _, m := range modes {
		b.Run(m.name, func(b *testing.B) {
			var n atomic.Int64
			var ds []*distlock.DistributeLock
			for range 3 {
				r := mustNew(b, countingClient(b, endpoints, &n), m.opts...)
				d, err := distlock.New(r, distlock.WithAutoRenew(), distlock.WithDefaultTTL(10*time.Second))
				if err != nil {
					b.Fatal(err)
				}
				b.Cleanup(func() { _ = d.Close() })
				ds = append(ds, d)
			}
			key := uniqueKey(b)
			n.Store(0)
			testsuite.Contend(b, ds, key, 12)
			b.ReportMetric(float64(n.Load())/float64(b.N), "rpcs/op")
		})
	}
}
