package stores

import (
	"context"
	"fmt"
	"strings"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	"google.golang.org/grpc"

	"github.com/distlock/distlock/backend"
	"github.com/distlock/distlock/etcd"
)

// etcdStore is an etcd cluster.
type etcdStore struct {
	name string
	cfg  clientv3.Config
	opts []etcd.Option
}

func parseEtcd(raw string, so Options) (*etcdStore, error) {
	h, err := parseHostList(raw, 2379, "dial_timeout")
	if err != nil {
		return nil, err
	}
	if p := strings.Trim(h.path, "/"); p != "" {
		return nil, fmt.Errorf("unexpected path %q: an etcd URL names hosts only (--prefix sets the keys' prefix)", h.path)
	}
	dial, err := h.duration("dial_timeout", defaultDialTimeout)
	if err != nil {
		return nil, err
	}
	cfg := clientv3.Config{DialTimeout: dial, Logger: zap.NewNop()}
	for _, host := range h.hosts {
		cfg.Endpoints = append(cfg.Endpoints, "http://"+host)
	}
	if h.user != nil {
		cfg.Username = h.user.Username()
		cfg.Password, _ = h.user.Password()
	}
	s := &etcdStore{name: h.name, cfg: cfg}
	if so.PrefixSet {
		s.opts = append(s.opts, etcd.WithPrefix(so.Prefix))
	}
	s.opts = append(s.opts, so.Etcd...)
	return s, nil
}

func (s *etcdStore) String() string { return s.name }

// ValidateKey asks the etcd store's own ValidateKey, on a Resource over a
// client that was never connected: it checks the key's length only.
func (s *etcdStore) ValidateKey(key string) error { return etcdProto().ValidateKey(key) }

// Proto is a Resource over a client that was never connected.
func (s *etcdStore) Proto() backend.RemoteResource { return etcdProto() }

// etcdProto is a Resource over a client that was never connected (New
// fails only for a nil client or option).
func etcdProto() *etcd.Resource {
	r, _ := etcd.New(new(clientv3.Client))
	return r
}

// holds: distlock renews its locks (WithAutoRenew), which etcd keeps on
// a lease shared by the locks of one TTL and kept alive by the client.
func (s *etcdStore) Holds(ttl time.Duration) string {
	secs := (ttl + time.Second - 1) / time.Second * time.Second
	return fmt.Sprintf("TTL %v (etcd leases count whole seconds): a lease the client keeps alive every third of it", secs)
}

func (s *etcdStore) Open(ctx context.Context, _ time.Duration) (backend.RemoteResource, func(), error) {
	c, err := clientv3.New(s.cfg)
	if err != nil {
		return nil, nil, err
	}
	// The client connects on its first request: make one that needs a
	// quorum (a linearizable read of nothing), so that an unreachable
	// cluster is reported now, whatever the wait. It waits for a
	// connection (WaitForReady), so that gRPC's error says why none came
	// (a refused connection, say), not only that the time ran out.
	bound := within(ctx, s.cfg.DialTimeout)
	pctx, cancel := context.WithTimeout(ctx, bound)
	defer cancel()
	req := &pb.RangeRequest{Key: []byte(etcd.DefaultPrefix), CountOnly: true}
	if _, err := clientv3.RetryKVClient(c).Range(pctx, req, grpc.WaitForReady(true)); err != nil {
		c.Close()
		return nil, nil, fmt.Errorf("reading from %s within %v: %w", strings.Join(s.cfg.Endpoints, ","), bound, err)
	}
	res, err := etcd.New(c, s.opts...)
	if err != nil {
		c.Close()
		return nil, nil, err
	}
	return res, func() { c.Close() }, nil
}
