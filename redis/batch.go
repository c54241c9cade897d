package redis

import (
	"context"
	"fmt"

	goredis "github.com/redis/go-redis/v9"

	"github.com/distlock/distlock/backend"
	"github.com/distlock/distlock/internal/redisscript"
)

var _ backend.BatchRefresher = (*Resource)(nil)

// RefreshAll implements [backend.BatchRefresher]: it extends every lease of
// ls as Refresh does, in one pipeline, one round trip per server. The
// mutexes go in one script (redisscript.BatchExtend) per hash slot on
// Cluster and in one script for all on a standalone server or Sentinel
// master; semaphores and read/write locks, and every lease over a
// *goredis.Ring, take a script each in the same pipeline. It returns one
// error per lease, in order: nil, backend.ErrNotHeld, or the store's
// error (a script that failed fails only its own leases). It returns when
// ctx ends, every lease's error then wrapping ctx's.
func (r *Resource) RefreshAll(ctx context.Context, ls []*backend.Lease) []error {
	errs := make([]error, len(ls))
	if r.c == nil {
		for i := range errs {
			errs[i] = errNilClient
		}
		return errs
	}
	if len(ls) == 1 {
		errs[0] = r.Refresh(ctx, ls[0])
		return errs
	}
	b := r.batch(ls)
	if !await(ctx, func() { b.exec(ctx, r.c) }) {
		for i := range errs {
			errs[i] = fmt.Errorf("redis: refresh %q: %w", ls[i].Key, ctx.Err())
		}
		return errs
	}
	for _, rq := range b.reqs {
		rq.results(ls, errs)
	}
	return errs
}

// refreshBatch is the requests of one RefreshAll.
type refreshBatch struct {
	reqs []*refreshReq
}

// refreshReq is one script of a batch: a BatchExtend over the mutexes
// idx of one slot, or the refresh of one lease.
type refreshReq struct {
	s    *goredis.Script
	keys []string
	args []any // ARGV
	idx  []int // the leases it extends, in the reply's order
	many bool  // the reply is an array, one result per lease
	cmd  *goredis.Cmd
}

// batch groups ls into the scripts of a batch.
func (r *Resource) batch(ls []*backend.Lease) *refreshBatch {
	b := &refreshBatch{}
	_, ring := r.c.(*goredis.Ring)
	bySlot := map[uint16]*refreshReq{}
	for i, l := range ls {
		ms := redisscript.Millis(l.TTL)
		if l.Kind != backend.KindMutex {
			h := r.khandleOf(l)
			b.reqs = append(b.reqs, &refreshReq{s: redisscript.GroupExtend, keys: h.keys[:3],
				args: []any{h.value, ms}, idx: []int{i}})
			continue
		}
		lock := r.lockKey(l)
		labeled := l.Label != ""
		flag := noFlag
		if labeled {
			flag = labelFlag
		}
		if ring {
			args := []any{l.Value, ms, flag, fenceFlag}
			b.reqs = append(b.reqs, &refreshReq{s: redisscript.Extend, keys: []string{lock}, args: args, idx: []int{i}})
			continue
		}
		var slot uint16
		if r.cluster != nil {
			slot = redisscript.Slot(lock)
		}
		rq := bySlot[slot]
		if rq == nil {
			rq = &refreshReq{s: redisscript.BatchExtend, many: true}
			bySlot[slot] = rq
			b.reqs = append(b.reqs, rq)
		}
		rq.keys = append(rq.keys, lock)
		rq.args = append(rq.args, l.Value, ms, flag)
		rq.idx = append(rq.idx, i)
	}
	return b
}

// exec sends every script of b in one pipeline (EVALSHA), and those a
// server did not have cached in a second one, with EVAL (which caches
// them: the next batch needs one round trip again).
func (b *refreshBatch) exec(ctx context.Context, c goredis.UniversalClient) {
	pipe := c.Pipeline()
	for _, rq := range b.reqs {
		rq.cmd = rq.s.EvalSha(ctx, pipe, rq.keys, rq.args...)
	}
	_, _ = pipe.Exec(ctx)
	redisscript.Resend(ctx, c, len(b.reqs), func(i int) *goredis.Cmd { return b.reqs[i].cmd },
		func(i int, p goredis.Pipeliner) {
			rq := b.reqs[i]
			rq.cmd = rq.s.Eval(ctx, p, rq.keys, rq.args...)
		})
}

// results writes rq's result for each of its leases into errs.
func (rq *refreshReq) results(ls []*backend.Lease, errs []error) {
	fail := func(err error) {
		for _, i := range rq.idx {
			errs[i] = fmt.Errorf("redis: refresh %q: %w", ls[i].Key, err)
		}
	}
	if err := rq.cmd.Err(); err != nil {
		fail(err)
		return
	}
	if !rq.many {
		n, err := rq.cmd.Int64()
		switch {
		case err != nil:
			fail(err)
		case n == 0:
			errs[rq.idx[0]] = backend.ErrNotHeld
		}
		return
	}
	ns, err := rq.cmd.Int64Slice()
	if err == nil && len(ns) != len(rq.idx) {
		err = fmt.Errorf("%w: %d results for %d locks", errBadReply, len(ns), len(rq.idx))
	}
	if err != nil {
		fail(err)
		return
	}
	for j, i := range rq.idx {
		if ns[j] == 0 {
			errs[i] = backend.ErrNotHeld
		}
	}
}
