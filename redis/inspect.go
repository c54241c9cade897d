package redis

import (
	"context"
	"errors"
	"fmt"
	"math"
	"slices"
	"strconv"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/distlock/distlock/backend"
	"github.com/distlock/distlock/internal/redisscript"
)

var (
	_ backend.Inspector    = (*Resource)(nil)
	_ backend.MultiSpinner = (*Resource)(nil)
)

// Inspect implements [backend.Inspector] with one read-only script
// (redisscript.Inspect): the holders of key's lock of kind, each with its
// token, its time left by the server's clock and its label. For a mutex
// the holder's token is the fence's value (no grant can follow the live
// one); for a read/write lock, kind KindWrite or KindRead lists readers and
// writers; a semaphore's inspection has its limit. It touches nothing, and
// returns when ctx ends.
func (r *Resource) Inspect(ctx context.Context, key string, kind backend.Kind) (backend.Inspection, error) {
	if r.c == nil {
		return backend.Inspection{}, errNilClient
	}
	lock, fence := redisscript.Layout(r.prefix, key)
	var keys []string
	var mode any = "g"
	switch kind {
	case backend.KindMutex:
		keys, mode = []string{lock, fence}, "m"
	case backend.KindSemaphore:
		keys = redisscript.SemaphoreKeys(lock)[:3]
	case backend.KindRead, backend.KindWrite:
		keys = redisscript.RWKeys(lock)[:3]
	default:
		return backend.Inspection{}, fmt.Errorf("%w %v", errUnknownKind, kind)
	}
	cmd := evalsha(inspectSHA, keys, mode)
	val, err := r.runValue(ctx, redisscript.Inspect, keys, cmd)
	if err != nil {
		return backend.Inspection{}, fmt.Errorf("redis: inspect %v %q: %w", kind, key, err)
	}
	in, err := parseInspection(val, kind)
	if err != nil {
		return backend.Inspection{}, fmt.Errorf("redis: inspect %v %q: %w", kind, key, err)
	}
	return in, nil
}

var errBadReply = errors.New("unexpected reply")

// parseInspection reads redisscript.Inspect's reply.
func parseInspection(val any, kind backend.Kind) (backend.Inspection, error) {
	var in backend.Inspection
	arr, ok := val.([]any)
	if !ok {
		return in, fmt.Errorf("%w %T", errBadReply, val)
	}
	if kind == backend.KindMutex {
		if len(arr) == 0 {
			return in, nil
		}
		if len(arr) != 4 {
			return in, fmt.Errorf("%w: %d items", errBadReply, len(arr))
		}
		tok, _ := arr[0].(string)
		token, err := strconv.ParseUint(tok, 10, 64)
		ms, ok1 := arr[1].(int64)
		label, ok2 := arr[2].(string)
		if err != nil || !ok1 || !ok2 {
			return in, fmt.Errorf("%w: %v", errBadReply, arr)
		}
		in.Holders = []backend.Holder{{Kind: kind, Token: token, TTL: millis(ms), Label: label}}
		return in, nil
	}
	if len(arr)%2 != 1 {
		return in, fmt.Errorf("%w: %d items", errBadReply, len(arr))
	}
	rw := kind != backend.KindSemaphore
	for i := 1; i < len(arr); i += 2 {
		rec, ok1 := arr[i].(string)
		ms, ok2 := arr[i+1].(int64)
		k, token, label, ok := redisscript.ParseRecord(rec, rw)
		if !ok || !ok1 || !ok2 {
			return in, fmt.Errorf("%w: holder %v, %v", errBadReply, arr[i], arr[i+1])
		}
		h := backend.Holder{Kind: backend.KindSemaphore, Token: token, TTL: millis(ms), Label: label}
		switch k {
		case 'r':
			h.Kind = backend.KindRead
		case 'w':
			h.Kind = backend.KindWrite
		}
		in.Holders = append(in.Holders, h)
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
	if len(in.Holders) > 0 && !rw {
		lim, _ := arr[0].(string)
		n, err := strconv.Atoi(lim)
		if err != nil {
			return in, fmt.Errorf("%w: limit %v", errBadReply, arr[0])
		}
		in.Limit = n
	}
	return in, nil
}

// millis is ms as a duration; 0 when negative (no expiry: not ours).
func millis(ms int64) time.Duration {
	if ms < 0 || ms > math.MaxInt64/int64(time.Millisecond) {
		return 0
	}
	return time.Duration(ms) * time.Millisecond
}

// TryAcquireAll implements [backend.MultiSpinner]: the mutexes of ls, all
// or none, in one script call (redisscript.MultiAcquire), which also sets
// each lease's token. On Cluster every key must be in one hash slot, and a
// *goredis.Ring's shards hash keys apart: for keys of several slots on
// Cluster, for any set of several keys over a Ring, and for locks of
// another kind than mutexes, and under [WithWaitReplicas], it returns
// errors.ErrUnsupported before any I/O (the facade then takes the keys one
// by one). A standalone server or
// a Sentinel master takes any set. Errors and clean-up as TryAcquire's:
// a request whose reply was lost is cleaned up on every key, with
// tombstones, at once or through the *backend.AbandonedError returned.
func (r *Resource) TryAcquireAll(ctx context.Context, ls []*backend.Lease) (bool, time.Duration, error) {
	if r.c == nil {
		return false, 0, errNilClient
	}
	if len(ls) == 0 {
		return true, 0, nil
	}
	if _, ring := r.c.(*goredis.Ring); (ring && len(ls) > 1) || r.waitReplicas > 0 {
		return false, 0, errors.ErrUnsupported
	}
	hs := make([]*handle, len(ls))
	keys := make([]string, 0, 2*len(ls))
	for i, l := range ls {
		if l.Kind != backend.KindMutex {
			return false, 0, errors.ErrUnsupported
		}
		if err := checkValue(l); err != nil {
			return false, 0, err
		}
		hs[i] = r.newHandle(l)
		keys = append(keys, hs[i].keys[0], hs[i].keys[1])
		if r.cluster != nil && redisscript.Slot(keys[2*i]) != redisscript.Slot(keys[0]) {
			return false, 0, errors.ErrUnsupported
		}
	}
	if err := ctx.Err(); err != nil {
		return false, 0, fmt.Errorf("redis: acquire %d keys: %w", len(ls), err)
	}
	first := ls[0]
	ms := redisscript.Millis(first.TTL)
	args := []any{first.Value, ms, first.Label}
	if first.Label == "" {
		args = args[:2]
	}
	cmd := evalsha(multiAcquireSHA, keys, args...)
	clean := func(ctx context.Context) error {
		var errs []error
		for _, h := range hs {
			errs = append(errs, r.cleanup(ctx, h))
		}
		return errors.Join(errs...)
	}
	val, err := r.runValue(ctx, redisscript.MultiAcquire, keys, cmd)
	if err != nil {
		return false, 0, r.failed(ctx, fmt.Errorf("redis: acquire %d keys (%q...): %w", len(ls), first.Key, err), clean)
	}
	switch v := val.(type) {
	case int64:
		return false, millis(-v), nil
	case []any:
		if len(v) != len(ls) {
			break
		}
		for i, t := range v {
			tok, ok := t.(int64)
			if !ok || tok <= 0 {
				return false, 0, r.failed(ctx, fmt.Errorf("redis: acquire %d keys: %w: token %v", len(ls), errBadReply, t), clean)
			}
			ls[i].Token = uint64(tok)
			if ms <= math.MaxInt64/int64(time.Millisecond) {
				ls[i].TTL = time.Duration(ms) * time.Millisecond
			}
		}
		return true, 0, nil
	}
	return false, 0, r.failed(ctx, fmt.Errorf("redis: acquire %d keys: %w %T", len(ls), errBadReply, val), clean)
}
