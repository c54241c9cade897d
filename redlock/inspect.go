package redlock

import (
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/distlock/distlock/backend"
	"github.com/distlock/distlock/internal/redisscript"
)

var _ backend.Inspector = (*Resource)(nil)

// inspectTimeout is the per-node timeout of Inspect when [WithNodeTimeout]
// sets none (the default timeout is a share of a lock's TTL, which an
// inspection does not have).
const inspectTimeout = time.Second

// Inspect implements [backend.Inspector] for mutexes (the only kind
// Redlock holds): it reads the lock on every node at once (the Redis
// backend's read-only inspection script) and reports as holder the owner
// value that a majority of the nodes hold, with the time until fewer than
// a majority hold it (the majority-th longest PTTL among them) and its
// label; its token is 0, as Redlock makes none. Two majorities share a
// node, so at most one value can be on a majority: the answer is sound,
// as a snapshot is, for the moment each node was read (the nodes are read
// one round trip apart, not at one instant). It returns an error wrapping
// [ErrNoQuorum] when fewer than a majority of the nodes answered within
// the per-node timeout (WithNodeTimeout, else a second), and returns when
// ctx ends.
func (r *Resource) Inspect(ctx context.Context, key string, kind backend.Kind) (backend.Inspection, error) {
	if kind != backend.KindMutex {
		return backend.Inspection{}, fmt.Errorf("redlock: inspect %v %q: %w", kind, key, errUnsupportedKind)
	}
	lock, fence := redisscript.Layout(r.prefix, key)
	timeout := r.nodeTimeout
	if timeout == 0 {
		timeout = inspectTimeout
	}
	type answer struct {
		i     int
		value string
		ms    int64
		label string
		err   error
	}
	answers := make(chan answer, len(r.nodes))
	for i, nd := range r.nodes {
		go func() {
			nctx, cancel := context.WithTimeout(ctx, timeout)
			defer cancel()
			a := answer{i: i}
			val, err := redisscript.Inspect.Run(nctx, nd.c, []string{lock, fence}, "m").Slice()
			switch {
			case err != nil:
				a.err = fmt.Errorf("%s: %w", nd.name, err)
			case len(val) == 0:
			case len(val) == 4:
				a.ms, _ = val[1].(int64)
				a.label, _ = val[2].(string)
				a.value, _ = val[3].(string)
			default:
				a.err = fmt.Errorf("%s: unexpected reply %v", nd.name, val)
			}
			answers <- a
		}()
	}
	var (
		errs []error
		got  []answer
	)
	for range r.nodes {
		select {
		case a := <-answers:
			if a.err != nil {
				errs = append(errs, a.err)
				continue
			}
			got = append(got, a)
		case <-ctx.Done():
			return backend.Inspection{}, fmt.Errorf("redlock: inspect %q: %w", key, ctx.Err())
		}
	}
	if len(got) < r.quorum {
		return backend.Inspection{}, fmt.Errorf("redlock: inspect %q: %w: %d of %d nodes failed, %d must answer: %w",
			key, ErrNoQuorum, len(errs), len(r.nodes), r.quorum, joined(errs))
	}
	byValue := map[string][]answer{}
	for _, a := range got {
		if a.value != "" {
			byValue[a.value] = append(byValue[a.value], a)
		}
	}
	for _, as := range byValue {
		if len(as) < r.quorum {
			continue
		}
		// Held until fewer than a majority hold it: the quorum-th
		// longest time left.
		slices.SortFunc(as, func(a, b answer) int { return int(b.ms - a.ms) })
		left := as[r.quorum-1].ms
		h := backend.Holder{Kind: backend.KindMutex, TTL: max(time.Duration(left)*time.Millisecond, 0)}
		for _, a := range as {
			if a.label != "" {
				h.Label = a.label
				break
			}
		}
		return backend.Inspection{Holders: []backend.Holder{h}}, nil
	}
	return backend.Inspection{}, nil
}
