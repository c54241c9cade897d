package zookeeper

import (
	"context"
	"errors"
	"slices"
	"time"

	"github.com/go-zookeeper/zk"

	"github.com/distlock/distlock/backend"
)

// Inspect implements [backend.Inspector]: it lists key's queue of kind
// (KindRead and KindWrite both read the read/write lock) and reads the
// data of the children that hold it, by the rules that grant it (see
// judge): one listing and one read per holder, the reads sent together.
// It touches nothing.
//
// Each holder's Token is its czxid, as its lock's token; Label and the
// time left come from its data (see "Inspection" in the package doc):
// the TTL is counted by the holder's client, so the time left is the
// TTL from the data's mtime (the server's clock when the znode was
// created or its TTL last written) against this process's clock, and 0
// when the session keeps the lock alive or that time has passed.
//
// A semaphore's limit is its holders', the limit of the queue's first
// child: a permit of another limit queued behind them (an acquire that
// fails for it, until its deletion lands, a round trip) is neither
// listed nor read. When the holders of the other limit have all gone
// before that deletion, such a child heads the queue and is listed, with
// its limit: the acquires queued after it count it as a holder too (they
// wait for it, or fail for its limit), so Inspect says what the store
// grants.
//
// It returns when ctx ends, with ctx's error; the store's errors wrapped.
func (r *Resource) Inspect(ctx context.Context, key string, kind backend.Kind) (backend.Inspection, error) {
	var in backend.Inspection
	if err := r.ValidateKey(key); err != nil {
		return in, err
	}
	if err := r.CheckKind(kind); err != nil {
		return in, err
	}
	if r.isClosed() {
		return in, ErrClosed
	}
	parent := r.kindParent(key, kind)
	children, err := call(ctx, func() ([]string, error) {
		cs, _, err := r.conn.Children(parent)
		return cs, err
	})
	switch {
	case errors.Is(err, zk.ErrNoNode):
		return in, nil
	case err != nil:
		return in, r.wrap("inspect", key, err)
	}
	q := queueOf(children, kind)
	hs := holders(q, kind)
	type read struct {
		data []byte
		stat *zk.Stat
	}
	pending := make([]<-chan result[read], len(hs))
	for i, j := range hs {
		path := parent + "/" + q[j].name
		pending[i] = send(func() (read, error) {
			data, st, err := r.conn.Get(path)
			return read{data, st}, err
		})
	}
	for i, j := range hs {
		var res result[read]
		select {
		case res = <-pending[i]:
		case <-ctx.Done():
			return backend.Inspection{}, ctx.Err()
		}
		switch {
		case errors.Is(res.err, zk.ErrNoNode):
			continue // released since the listing
		case res.err != nil:
			return backend.Inspection{}, r.wrap("inspect", key, res.err)
		}
		rec := decodeRecord(res.v.data)
		h := backend.Holder{Kind: kind, Token: uint64(res.v.stat.Czxid), Label: rec.label}
		if kind == backend.KindRead || kind == backend.KindWrite {
			h.Kind = q[j].kind
		}
		if !rec.kept && rec.ttl > 0 {
			h.TTL = max(time.Until(time.UnixMilli(res.v.stat.Mtime).Add(rec.ttl)), 0)
		}
		in.Holders = append(in.Holders, h)
		if kind == backend.KindSemaphore {
			in.Limit = q[j].limit
		}
	}
	slices.SortFunc(in.Holders, func(a, b backend.Holder) int {
		switch {
		case a.Token < b.Token:
			return -1
		case a.Token > b.Token:
			return 1
		}
		return 0
	})
	return in, nil
}
