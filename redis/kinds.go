package redis

import (
	"context"
	"errors"
	"fmt"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/distlock/distlock/backend"
	"github.com/distlock/distlock/internal/redisscript"
)

var (
	_ backend.KindChecker  = (*Resource)(nil)
	_ backend.Withdrawer   = (*Resource)(nil)
	_ backend.Queuer       = (*Resource)(nil)
	_ backend.HeadNotifier = (*Resource)(nil)
)

// Queues implements [backend.Queuer]: the waiters of mutexes and
// semaphores queue in arrival order (see "Waiting in line" in the package
// doc).
func (r *Resource) Queues(k backend.Kind) bool {
	return k == backend.KindMutex || k == backend.KindSemaphore
}

// CheckKind implements [backend.KindChecker]: the Resource holds mutexes,
// semaphores and read/write locks.
func (r *Resource) CheckKind(k backend.Kind) error {
	switch k {
	case backend.KindMutex, backend.KindSemaphore, backend.KindRead, backend.KindWrite:
		return nil
	}
	return fmt.Errorf("%w %v", errUnknownKind, k)
}

// khandle is handle's counterpart for a semaphore or a read/write lock:
// the keys (redisscript.SemaphoreKeys or RWKeys) and the acquire command,
// built once per acquisition.
type khandle struct {
	key, value string
	kind       backend.Kind
	limit      int32
	waits      bool
	ms         int64
	keys       []string
	acq        []any // EVALSHA semacquire|rwacquire n keys... value ms limit|r|w [label]
}

// rw reports whether h is a read/write lock's.
func (h *khandle) rw() bool { return h.kind != backend.KindSemaphore }

func (h *khandle) script() *goredis.Script {
	if h.rw() {
		return redisscript.RWAcquire
	}
	return redisscript.SemAcquire
}

func (r *Resource) newKHandle(l *backend.Lease, ms int64) *khandle {
	h := &khandle{key: l.Key, value: l.Value, kind: l.Kind, limit: l.Limit, ms: ms, waits: l.Waits}
	lock, _ := redisscript.Layout(r.prefix, l.Key)
	var sha, arg any
	switch l.Kind {
	case backend.KindSemaphore:
		h.keys, sha, arg = redisscript.SemaphoreKeys(lock), semAcquireSHA, l.Limit
	case backend.KindRead:
		h.keys, sha, arg = redisscript.RWKeys(lock), rwAcquireSHA, "r"
	default:
		h.keys, sha, arg = redisscript.RWKeys(lock), rwAcquireSHA, "w"
	}
	args := []any{l.Value, ms, arg, l.Label, waitsFlag, r.publish}
	switch {
	case l.Waits && l.Kind == backend.KindSemaphore:
	case l.Label != "":
		args = args[:4]
	default:
		args = args[:3]
	}
	h.acq = evalsha(sha, h.keys, args...)
	return h
}

// khandleOf returns the lease's handle, or a fresh one (not stored) when
// it has none of ours.
func (r *Resource) khandleOf(l *backend.Lease) *khandle {
	if h, ok := l.Handle.(*khandle); ok && h.key == l.Key && h.value == l.Value && h.kind == l.Kind {
		return h
	}
	return r.newKHandle(l, redisscript.Millis(l.TTL))
}

// tryAcquireKind is TryAcquire for a semaphore or a read/write lock: one
// script, redisscript.SemAcquire or RWAcquire.
func (r *Resource) tryAcquireKind(ctx context.Context, l *backend.Lease, ms int64) (bool, time.Duration, error) {
	h, ok := l.Handle.(*khandle)
	if !ok || h.key != l.Key || h.value != l.Value || h.ms != ms || h.kind != l.Kind || h.limit != l.Limit || h.waits != l.Waits {
		h = r.newKHandle(l, ms)
		l.Handle = h
	}
	var (
		v   int64
		err error
	)
	if r.waitReplicas > 0 {
		v, err = r.acquireWait(ctx, h.script(), h.keys, h.acq)
	} else {
		v, err = r.run(ctx, h.script(), h.keys, h.acq)
	}
	if err != nil {
		if redisscript.IsLimit(err) {
			// The script refused before it wrote anything.
			return false, 0, fmt.Errorf("redis: acquire semaphore %q with limit %d: %w (%v)", l.Key, l.Limit, backend.ErrLimitMismatch, err)
		}
		return false, 0, r.failed(ctx, fmt.Errorf("redis: acquire %v %q: %w", l.Kind, l.Key, err),
			func(ctx context.Context) error { return r.cleanupKind(ctx, h) })
	}
	acquired, token, holderTTL := redisscript.DecodeAcquire(v)
	if acquired {
		l.Token = token
	}
	return acquired, holderTTL, nil
}

// cleanupKind is cleanup for a semaphore or read/write lock: the value's
// tombstone, then its grant and intent dropped (redisscript.GroupCleanup).
func (r *Resource) cleanupKind(ctx context.Context, h *khandle) error {
	if r.c == nil {
		return errNilClient
	}
	ctx, cancel := context.WithTimeout(ctx, cleanupTimeout)
	defer cancel()
	keys := h.keys[:3]
	if h.rw() {
		keys = []string{h.keys[0], h.keys[1], h.keys[2], h.keys[4], h.keys[5], h.keys[6]}
	}
	cmd := evalsha(groupCleanupSHA, keys, h.value, h.ms, r.publish)
	_, err := r.run(ctx, redisscript.GroupCleanup, keys, cmd)
	return err
}

// releaseKind is Release for a semaphore or read/write lock.
func (r *Resource) releaseKind(ctx context.Context, l *backend.Lease) error {
	h := r.khandleOf(l)
	var rw any = ""
	if h.rw() {
		rw = "rw"
	}
	cmd := []any{"evalsha", groupReleaseSHA, 3, h.keys[0], h.keys[1], h.keys[2], h.value, r.publish, rw}
	n, err := r.run(ctx, redisscript.GroupRelease, h.keys[:3], cmd)
	if err != nil {
		return fmt.Errorf("redis: release %v %q: %w", l.Kind, l.Key, err)
	}
	if n == 0 {
		return backend.ErrNotHeld
	}
	return nil
}

// refreshKind is Refresh for a semaphore or read/write lock.
func (r *Resource) refreshKind(ctx context.Context, l *backend.Lease) error {
	h := r.khandleOf(l)
	cmd := []any{"evalsha", groupExtendSHA, 3, h.keys[0], h.keys[1], h.keys[2], h.value, redisscript.Millis(l.TTL)}
	n, err := r.run(ctx, redisscript.GroupExtend, h.keys[:3], cmd)
	if err != nil {
		return fmt.Errorf("redis: refresh %v %q: %w", l.Kind, l.Key, err)
	}
	if n == 0 {
		return backend.ErrNotHeld
	}
	return nil
}

// Withdraw implements [backend.Withdrawer]: it deletes the intent a
// waiting request recorded (see the package doc): a reader's or writer's,
// with a release notice when there was one, so that the requests it kept
// waiting retry at once; a mutex or semaphore waiter's place in line, and
// a mutex kept for it (it was the head) goes to the next in line, who is
// told. It touches nothing else.
func (r *Resource) Withdraw(ctx context.Context, l *backend.Lease) error {
	if r.c == nil {
		return errNilClient
	}
	if l.Kind == backend.KindMutex || l.Kind == backend.KindSemaphore {
		lock := r.lockKey(l)
		var kind any = ""
		if l.Kind == backend.KindSemaphore {
			kind = redisscript.SemSuffix
		}
		cmd := []any{"evalsha", withdrawSHA, 1, lock, l.Value, r.publish, kind}
		if _, err := r.run(ctx, redisscript.Withdraw, []string{lock}, cmd); err != nil {
			return fmt.Errorf("redis: withdraw %v %q: %w", l.Kind, l.Key, err)
		}
		return nil
	}
	if l.Kind != backend.KindRead && l.Kind != backend.KindWrite {
		return nil
	}
	h := r.khandleOf(l)
	keys := []string{h.keys[0], h.keys[4], h.keys[5], h.keys[6]}
	cmd := []any{"evalsha", rwWithdrawSHA, 4, keys[0], keys[1], keys[2], keys[3], h.value, r.publish}
	if _, err := r.run(ctx, redisscript.RWWithdraw, keys, cmd); err != nil {
		return fmt.Errorf("redis: withdraw %v %q: %w", l.Kind, l.Key, err)
	}
	return nil
}

var errUnknownKind = errors.New("redis: unknown kind of lock")
