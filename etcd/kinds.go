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
//	<prefix><encoded key>/<resource ID>-<slot>                 mutex
//	<prefix>!sem/<encoded key>/<limit>-<resource ID>-<slot>    semaphore
//	<prefix>!rw/<encoded key>/r-<resource ID>-<slot>           read/write lock: a reader
//	<prefix>!rw/<encoded key>/w-<resource ID>-<slot>           read/write lock: a writer
//
// where <limit> is the semaphore's limit in 16 hex digits (semTag), so
// that the keys of one limit are one range of the directory, which the
// transaction that makes a key can check for strangers (see enqueueTxn).
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

// tag is what the names of the keys of kind k (and limit, for a
// semaphore) start with in their directory.
func tag(k backend.Kind, limit int) string {
	var b [semTagLen]byte
	return string(appendTag(b[:0], k, limit))
}

// appendTag appends tag(k, limit) to b.
func appendTag(b []byte, k backend.Kind, limit int) []byte {
	switch k {
	case backend.KindRead:
		return append(b, readTag...)
	case backend.KindWrite:
		return append(b, writeTag...)
	case backend.KindSemaphore:
		return appendSemTag(b, limit)
	}
	return b
}

// semTagLen is the length of a semaphore key's tag.
const semTagLen = 17

// semTag is the tag of the keys of a semaphore of limit: the limit in 16
// hex digits and '-'. Tags of different limits are the same length, so
// none is a prefix of another.
func semTag(limit int) string {
	var b [semTagLen]byte
	return string(appendSemTag(b[:0], limit))
}

// appendSemTag appends semTag(limit) to b.
func appendSemTag(b []byte, limit int) []byte {
	const hex = "0123456789abcdef"
	for i := 15; i >= 0; i-- {
		b = append(b, hex[(limit>>(4*i))&15])
	}
	return append(b, '-')
}

// semTagLimit reads a semaphore key's limit from its name (after the
// directory); ok is false for a name semTag did not start.
func semTagLimit(name string) (limit int, ok bool) {
	if len(name) < semTagLen || name[semTagLen-1] != '-' {
		return 0, false
	}
	n, err := strconv.ParseUint(name[:semTagLen-1], 16, 63)
	if err != nil {
		return 0, false
	}
	return int(n), true
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
// hold: the oldest key of the queue (a mutex, a writer), the number of
// keys (a semaphore) or of writers (a reader).
func enqueueReads(h *handle, n qname) []clientv3.Op {
	switch h.kind() {
	case backend.KindSemaphore:
		return []clientv3.Op{clientv3.OpGet(n.dir(), clientv3.WithPrefix(), clientv3.WithCountOnly())}
	case backend.KindRead:
		return []clientv3.Op{clientv3.OpGet(n.dir()+writeTag, clientv3.WithPrefix(), clientv3.WithCountOnly())}
	}
	return []clientv3.Op{clientv3.OpGet(n.dir(), firstKeyOnly...)}
}

// firstKeyOnly reads the key of a directory's oldest key, made once: the
// options are funcs that only set fields.
var firstKeyOnly = append(clientv3.WithFirstCreate(), clientv3.WithKeysOnly())

// standingAfterPut tells from enqueueReads' responses (rs) whether h
// holds: our key is the newest of its queue at that revision. (A
// semaphore's transaction made our key only if every key of the queue
// has our limit: see enqueueTxn.)
func standingAfterPut(h *handle, rs []*pb.RangeResponse) bool {
	switch h.kind() {
	case backend.KindSemaphore:
		return rs[0].Count-1 < int64(h.limit())
	case backend.KindRead:
		return rs[0].Count == 0
	}
	first := rs[0].Kvs
	return len(first) == 1 && first[0].CreateRevision == h.rev
}

// otherLimits are the compares by which enqueueTxn makes a semaphore's
// key only when the queue holds no key of another limit (or of a name
// that no Resource writes): none in the directory before the range of
// our limit's tag, none after it. etcd compares every key of a range
// (an empty range compares as a key that does not exist), so the check
// and the put are one atomic step: a key of another limit is never made,
// and every key in a semaphore's queue has the limit of the others. The
// holders therefore agree on the limit at every revision, and no
// acquire fails for a key whose own acquire is failing.
func otherLimits(n qname) []clientv3.Cmp {
	dir, ns := n.dir(), n.ns()
	after := clientv3.GetPrefixRangeEnd(ns)
	return []clientv3.Cmp{
		clientv3.Compare(clientv3.CreateRevision(dir), "=", 0).WithRange(ns),
		clientv3.Compare(clientv3.CreateRevision(after), "=", 0).WithRange(clientv3.GetPrefixRangeEnd(dir)),
	}
}

// otherLimitReads are the reads, in enqueueTxn's else branch, of a key of
// another limit before and after the range of ours (see otherLimits).
func otherLimitReads(n qname) []clientv3.Op {
	dir, ns := n.dir(), n.ns()
	after := clientv3.GetPrefixRangeEnd(ns)
	return []clientv3.Op{
		clientv3.OpGet(dir, clientv3.WithRange(ns), clientv3.WithLimit(1), clientv3.WithKeysOnly()),
		clientv3.OpGet(after, clientv3.WithRange(clientv3.GetPrefixRangeEnd(dir)), clientv3.WithLimit(1), clientv3.WithKeysOnly()),
	}
}

// limitMismatch returns the error of an acquire of h, a semaphore's,
// whose transaction found the keys of other limits in rs (the responses
// of otherLimitReads), or nil when it found none.
func limitMismatch(h *handle, n qname, rs []*pb.ResponseOp) error {
	for _, r := range rs {
		kvs := r.GetResponseRange().Kvs
		if len(kvs) == 0 {
			continue
		}
		name := strings.TrimPrefix(string(kvs[0].Key), n.dir())
		if limit, ok := semTagLimit(name); ok {
			return fmt.Errorf("%w: held with limit %d, asked with %d", backend.ErrLimitMismatch, limit, h.limit())
		}
		return fmt.Errorf("%w: queue key %s of an unknown limit, asked with %d", backend.ErrLimitMismatch, kvs[0].Key, h.limit())
	}
	return nil
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
func (r *Resource) standing(ctx context.Context, h *handle, n qname) (target, int64, error) {
	before := clientv3.WithMaxCreateRev(h.rev - 1)
	var op clientv3.Op
	switch h.kind() {
	case backend.KindSemaphore:
		// The newest Limit keys before ours (the server ignores a limit
		// combined with a revision filter until it has filtered).
		op = clientv3.OpGet(n.dir(), clientv3.WithPrefix(), before, clientv3.WithKeysOnly(),
			clientv3.WithSort(clientv3.SortByCreateRevision, clientv3.SortDescend), clientv3.WithLimit(int64(h.limit())))
	case backend.KindRead:
		op = clientv3.OpGet(n.dir()+writeTag, append(clientv3.WithLastCreate(), before, clientv3.WithKeysOnly())...)
	default:
		op = clientv3.OpGet(n.dir(), append(clientv3.WithLastCreate(), before, clientv3.WithKeysOnly())...)
	}
	resp, err := r.c.Txn(ctx).Then(op, clientv3.OpGet(n.key, clientv3.WithKeysOnly())).Commit()
	if err != nil {
		return target{}, 0, err
	}
	if own := resp.Responses[1].GetResponseRange().Kvs; len(own) == 0 || own[0].CreateRevision != h.rev {
		return target{}, 0, fmt.Errorf("queue key %s is gone (lease %x expired or revoked): %w",
			n.key, int64(h.leaseID()), rpctypes.ErrLeaseNotFound)
	}
	rr := resp.Responses[0].GetResponseRange()
	rev := resp.Header.Revision
	if h.kind() == backend.KindSemaphore {
		switch {
		case len(rr.Kvs) < h.limit():
			return target{}, rev, nil
		case !rr.More:
			return target{key: n.dir(), dir: true}, rev, nil
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
func (r *Resource) touch(h *handle, n qname, value string) {
	r.later(0, func(ctx context.Context) bool {
		_, err := r.c.Txn(ctx).
			If(clientv3.Compare(clientv3.CreateRevision(n.key), "=", h.rev)).
			Then(clientv3.OpPut(n.key, value, clientv3.WithLease(h.leaseID()))).
			Commit()
		return err == nil || errors.Is(err, rpctypes.ErrLeaseNotFound)
	})
}
