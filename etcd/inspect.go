package etcd

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/distlock/distlock/backend"
)

var _ backend.Inspector = (*Resource)(nil)

// Inspect tells who holds the lock of key and kind (for a read/write lock,
// KindRead or KindWrite: its readers and writers), without taking it and
// touching nothing: one read of the lock's queue, then one TimeToLive of
// each holder's lease. Each holder's token is its key's create revision,
// its label the one kept in its key's value, and its time left the
// lease's, by the server's clock: on a shared lease, which outlives its
// locks by a third of their TTL and which the locks' owner keeps alive,
// at most the lock's TTL. etcd tells it in whole seconds, rounded down (0:
// less than a second). Holders whose lease ended between the two reads
// are not listed. A semaphore's limit is its oldest key's: every key of
// its queue has that limit, as no transaction makes a key of another
// limit beside them (otherLimits), so no acquire failing for its limit
// leaves a key to be read here.
func (r *Resource) Inspect(ctx context.Context, key string, kind backend.Kind) (backend.Inspection, error) {
	if r == nil || r.c == nil {
		return backend.Inspection{}, errNilClient
	}
	if err := r.CheckKind(kind); err != nil {
		return backend.Inspection{}, err
	}
	if r.clientClosed() {
		return backend.Inspection{}, fmt.Errorf("etcd: inspect %q: client closed", key)
	}
	dir := r.queueDir(kind, key)
	opts := []clientv3.OpOption{clientv3.WithPrefix(), clientv3.WithSort(clientv3.SortByCreateRevision, clientv3.SortAscend)}
	if kind == backend.KindMutex {
		opts = append(opts, clientv3.WithLimit(1))
	}
	resp, err := r.c.Get(ctx, dir, opts...)
	if err != nil {
		return backend.Inspection{}, fmt.Errorf("etcd: inspect %q: %w", key, err)
	}
	type held struct {
		h     backend.Holder
		lease clientv3.LeaseID
		ttl   time.Duration
	}
	var hs []held
	var in backend.Inspection
	add := func(k backend.Kind, rev, lease int64, e entry) {
		hs = append(hs, held{backend.Holder{Kind: k, Token: uint64(rev), Label: e.label}, clientv3.LeaseID(lease), e.ttl})
	}
	kvs := resp.Kvs
	switch kind {
	case backend.KindMutex:
		if len(kvs) > 0 {
			_, e, _ := parseEntry(kvs[0].Value)
			add(kind, kvs[0].CreateRevision, kvs[0].Lease, e)
		}
	case backend.KindSemaphore:
		// The oldest Limit keys hold (a key of a name no Resource
		// writes, of another limit, is skipped).
		if len(kvs) > 0 {
			_, first, _ := parseEntry(kvs[0].Value)
			in.Limit = first.limit
			for _, kv := range kvs[:min(len(kvs), max(first.limit, 0))] {
				if _, e, ok := parseEntry(kv.Value); ok && e.limit == first.limit {
					add(kind, kv.CreateRevision, kv.Lease, e)
				}
			}
		}
	default:
		// A writer holds alone as the oldest key; readers hold up to the
		// first writer.
		for i, kv := range kvs {
			name := strings.TrimPrefix(string(kv.Key), dir)
			_, e, _ := parseEntry(kv.Value)
			if strings.HasPrefix(name, writeTag) {
				if i == 0 {
					add(backend.KindWrite, kv.CreateRevision, kv.Lease, e)
				}
				break
			}
			add(backend.KindRead, kv.CreateRevision, kv.Lease, e)
		}
	}
	// One TimeToLive per lease, at once.
	left := map[clientv3.LeaseID]time.Duration{} // < 0: gone
	var ids []clientv3.LeaseID
	for _, h := range hs {
		if _, ok := left[h.lease]; !ok {
			left[h.lease] = 0
			ids = append(ids, h.lease)
		}
	}
	var mu sync.Mutex
	var wg sync.WaitGroup
	var firstErr error
	for _, id := range ids {
		wg.Go(func() {
			ttl, err := r.c.TimeToLive(ctx, id)
			mu.Lock()
			defer mu.Unlock()
			switch {
			case errors.Is(err, rpctypes.ErrLeaseNotFound):
				left[id] = -1
			case err != nil && firstErr == nil:
				firstErr = err
			case err == nil:
				// Whole seconds, rounded down: 0 is less than a second.
				left[id] = time.Duration(ttl.TTL) * time.Second
			}
		})
	}
	wg.Wait()
	if firstErr != nil {
		return backend.Inspection{}, fmt.Errorf("etcd: inspect %q: %w", key, firstErr)
	}
	for _, h := range hs {
		ttl := left[h.lease]
		if ttl < 0 { // the lease ended, with the key
			continue
		}
		if h.ttl > 0 {
			ttl = min(ttl, h.ttl)
		}
		h.h.TTL = ttl
		in.Holders = append(in.Holders, h.h)
	}
	if len(in.Holders) == 0 {
		in.Limit = 0
	}
	return in, nil
}
