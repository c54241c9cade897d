package etcd

import (
	"context"
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/distlock/distlock/backend"
)

// The queues of a lock key, one per kind, each a directory of its own:
//
//	<prefix><encoded key>/<resource ID>-<slot>          mutex
//	<prefix>!sem/<encoded key>/<resource ID>-<slot>     semaphore
//	<prefix>!rw/<encoded key>/r-<resource ID>-<slot>    read/write lock: a reader
//	<prefix>!rw/<encoded key>/w-<resource ID>-<slot>    read/write lock: a writer
//
// An encoded key never holds '!', so the semaphore and read/write
// directories (and the shared leases' fence keys, <prefix>!fence/...)
// are never a mutex's.
const (
	semDir   = "!sem/"
	rwDir    = "!rw/"
	readTag  = "r-"
	writeTag = "w-"
)

var _ backend.KindChecker = (*Resource)(nil)

// CheckKind reports whether the Resource holds locks of kind k: it holds
// mutexes, semaphores and read/write locks. It does no I/O.
func (r *Resource) CheckKind(k backend.Kind) error {
	switch k {
	case backend.KindMutex, backend.KindSemaphore, backend.KindRead, backend.KindWrite:
		return nil
	}
	return fmt.Errorf("etcd: no lock of kind %v", k)
}

// queueDir is the directory of the queue of key's lock of kind k.
func (r *Resource) queueDir(k backend.Kind, key string) string {
	switch k {
	case backend.KindSemaphore:
		return r.prefix + semDir + encodeKey(key) + "/"
	case backend.KindRead, backend.KindWrite:
		return r.prefix + rwDir + encodeKey(key) + "/"
	}
	return r.queuePrefix(key)
}

// queueKinds has one kind per queue directory of a lock key (a read
// lock's queue is its write lock's), in the order Leftovers lists them.
var queueKinds = []backend.Kind{backend.KindMutex, backend.KindSemaphore, backend.KindWrite}

// tag is what the names of kind k's keys start with in their directory.
func tag(k backend.Kind) string {
	switch k {
	case backend.KindRead:
		return readTag
	case backend.KindWrite:
		return writeTag
	}
	return ""
}

// entry is what a queue key holds besides the owner value.
type entry struct {
	label string
	limit int           // a semaphore's limit, 0 for the other kinds
	ttl   time.Duration // the lock's TTL, whole seconds
}

// entryValue is what a queue key holds: the owner value, the holder's
// label, a semaphore's limit (0 for the other kinds) and the lock's TTL
// in seconds, written as owner + label + "|" + hex(len(label)) + "|" +
// hex(limit) + "|" + hex(TTL seconds), which reads back from its end
// whatever bytes the owner value and the label hold.
func entryValue(owner, label string, limit int, ttl time.Duration) string {
	return owner + label + "|" + strconv.FormatInt(int64(len(label)), 16) + "|" + strconv.FormatInt(int64(limit), 16) +
		"|" + strconv.FormatInt(ttlSeconds(ttl), 16)
}

// parseEntry reads a queue key's value back (see entryValue).
func parseEntry(v []byte) (owner string, e entry, ok bool) {
	s := string(v)
	var f [3]int64
	for i := range f {
		j := strings.LastIndexByte(s, '|')
		if j < 0 {
			return "", entry{}, false
		}
		n, err := strconv.ParseInt(s[j+1:], 16, 64)
		if err != nil || n < 0 {
			return "", entry{}, false
		}
		f[len(f)-1-i], s = n, s[:j]
	}
	if f[0] > int64(len(s)) || f[2] > math.MaxInt64/int64(time.Second) {
		return "", entry{}, false
	}
	cut := len(s) - int(f[0])
	return s[:cut], entry{label: s[cut:], limit: int(f[1]), ttl: time.Duration(f[2]) * time.Second}, true
}

// enqueueReads are the reads enqueue's transaction makes after the put of
// our key, at that revision, from which standingAfterPut tells whether we
// hold: the oldest key of the queue (a mutex, a writer, a semaphore: its
// limit), and the number of keys (a semaphore) or of writers (a reader).
func enqueueReads(h *handle) []clientv3.Op {
	switch h.kind {
	case backend.KindSemaphore:
		return []clientv3.Op{clientv3.OpGet(h.dir(), clientv3.WithFirstCreate()...), clientv3.OpGet(h.dir(), clientv3.WithPrefix(), clientv3.WithCountOnly())}
	case backend.KindRead:
		return []clientv3.Op{clientv3.OpGet(h.dir()+writeTag, clientv3.WithPrefix(), clientv3.WithCountOnly())}
	}
	return []clientv3.Op{clientv3.OpGet(h.dir(), append(clientv3.WithFirstCreate(), clientv3.WithKeysOnly())...)}
}

// standingAfterPut tells from enqueueReads' responses (rs) whether h
// holds: our key is the newest of its queue at that revision. A
// semaphore whose oldest key has another limit than ours fails with
// backend.ErrLimitMismatch.
func standingAfterPut(h *handle, rs []*pb.RangeResponse) (bool, error) {
	switch h.kind {
	case backend.KindSemaphore:
		if first := rs[0].Kvs; len(first) == 1 && first[0].CreateRevision != h.rev {
			if _, e, ok := parseEntry(first[0].Value); ok && e.limit != h.limit {
				return false, fmt.Errorf("%w: held with limit %d, asked with %d", backend.ErrLimitMismatch, e.limit, h.limit)
			}
		}
		return rs[1].Count-1 < int64(h.limit), nil
	case backend.KindRead:
		return rs[0].Count == 0, nil
	}
	first := rs[0].Kvs
	return len(first) == 1 && first[0].CreateRevision == h.rev, nil
}

// target is what a waiter watches: a key's deletion (one key, the
// waiter's predecessor of interest), a key's every change (a semaphore
// waiter behind another waiter, which puts its key again when it holds),
// or any deletion in its queue (the first waiter of a semaphore, which
// holds once any of the Limit keys before it goes). An empty key means
// the waiter holds.
type target struct {
	key  string
	puts bool // wake on a put of key too
	dir  bool // key is the queue's directory: wake on any deletion in it
}

// wakes reports whether ev, an event of the waiter's queue directory, is
// what t waits for.
func (t target) wakes(ev *clientv3.Event) bool {
	del := ev.Type == clientv3.EventTypeDelete
	if t.dir {
		return del
	}
	return string(ev.Kv.Key) == t.key && (del || t.puts)
}

// standing reads, at one revision, our own key and what decides whether
// we hold, and returns what to wait for (nothing when we hold) and the
// revision read. A waiter whose key is gone gets an error wrapping
// rpctypes.ErrLeaseNotFound.
//
//   - a mutex or a writer holds when no key precedes it, and waits for
//     the deletion of the key just before it;
//   - a reader holds when no writer's key precedes it, and waits for the
//     deletion of the newest writer's key before it;
//   - a semaphore holder holds when fewer than Limit keys precede it. The
//     first waiter (exactly Limit before it) waits for any deletion in the
//     queue; a waiter behind it waits for any change of the key just
//     before it, a waiter too, which puts its key again once it holds
//     (see touch): so one release wakes one waiter, as the internal lock
//     of Curator's InterProcessSemaphoreV2 does.
func (r *Resource) standing(ctx context.Context, h *handle) (target, int64, error) {
	before := clientv3.WithMaxCreateRev(h.rev - 1)
	var op clientv3.Op
	switch h.kind {
	case backend.KindSemaphore:
		// The newest Limit keys before ours (the server ignores a limit
		// combined with a revision filter until it has filtered).
		op = clientv3.OpGet(h.dir(), clientv3.WithPrefix(), before, clientv3.WithKeysOnly(),
			clientv3.WithSort(clientv3.SortByCreateRevision, clientv3.SortDescend), clientv3.WithLimit(int64(h.limit)))
	case backend.KindRead:
		op = clientv3.OpGet(h.dir()+writeTag, append(clientv3.WithLastCreate(), before, clientv3.WithKeysOnly())...)
	default:
		op = clientv3.OpGet(h.dir(), append(clientv3.WithLastCreate(), before, clientv3.WithKeysOnly())...)
	}
	resp, err := r.c.Txn(ctx).Then(op, clientv3.OpGet(h.key, clientv3.WithKeysOnly())).Commit()
	if err != nil {
		return target{}, 0, err
	}
	if own := resp.Responses[1].GetResponseRange().Kvs; len(own) == 0 || own[0].CreateRevision != h.rev {
		return target{}, 0, fmt.Errorf("queue key %s is gone (lease %x expired or revoked): %w",
			h.key, int64(h.lease), rpctypes.ErrLeaseNotFound)
	}
	rr := resp.Responses[0].GetResponseRange()
	rev := resp.Header.Revision
	if h.kind == backend.KindSemaphore {
		switch {
		case len(rr.Kvs) < h.limit:
			return target{}, rev, nil
		case !rr.More:
			return target{key: h.dir(), dir: true}, rev, nil
		}
		return target{key: string(rr.Kvs[0].Key), puts: true}, rev, nil
	}
	if len(rr.Kvs) == 0 {
		return target{}, rev, nil
	}
	return target{key: string(rr.Kvs[0].Key)}, rev, nil
}

// touch puts a semaphore holder's key again, unchanged, if it is still
// ours: the waiter behind it, which watches it, then looks whether it
// holds too (see standing). It runs in the background: a failed touch
// only delays that waiter until our release.
func (r *Resource) touch(h *handle) {
	r.later(0, func(ctx context.Context) bool {
		_, err := r.c.Txn(ctx).
			If(clientv3.Compare(clientv3.CreateRevision(h.key), "=", h.rev)).
			Then(clientv3.OpPut(h.key, h.value(), clientv3.WithLease(h.lease))).
			Commit()
		return err == nil || errors.Is(err, rpctypes.ErrLeaseNotFound)
	})
}
