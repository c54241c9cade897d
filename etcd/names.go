package etcd

import (
	"hash/maphash"
	"math/bits"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/distlock/distlock/backend"
)

// handle is the backend state of one held lock (backend.Lease.Handle),
// and its loss signal (backend.LossSignal). It keeps no copy of its queue
// key: the key is made again, in one allocation, from the lock's key (the
// Lease's Key, the same string), its kind and the slot of its name, when
// a request needs it (name). A held lock on a shared lease that the lease
// keeps alive (AutoRenew) costs this handle (64 B) and its place in the
// key watch's table of names; what only some locks need is in extra.
type handle struct {
	lockKey string   // the lock's key (backend.Lease.Key)
	rev     int64    // our queue key's create revision: the token; 0 until known
	sess    *session // the shared lease; nil for a lock on a lease of its own (x)
	x       *extra   // nil for a mutex or a read/write lock that its shared lease keeps alive
	next    *handle  // the next in its bucket of the key watch's table of names

	// lost is made by the first Done (under lostMu), closed when fired.
	lost chan struct{}

	slot int32 // its name's slot in the name space
	// flags holds the lock's kind (kindShift up, set once) and the bits
	// bitWatched to bitFired: one word, so that the handle stays 64 B.
	// bitFreed and bitFired are set atomically and read without a
	// mutex; the others change under the key watch's mutex.
	flags atomic.Uint32
}

// extra is what only some locks need: a lock on a lease of its own
// (r, lease, ttl), a semaphore (limit), a lock on a shared lease that the
// lease alone does not keep alive (its TTL timer, guarded by the key
// watch's mutex).
type extra struct {
	r        *Resource
	lease    clientv3.LeaseID
	ttl      time.Duration // the lease's granted TTL
	limit    int32         // a semaphore's limit (the facade bounds it by math.MaxInt32)
	deadline time.Time
	timer    *time.Timer // nil unless the lock has a TTL timer
}

// The bits of handle.flags.
const (
	bitWatched   uint32 = 1 << iota // registered for the loss signal (watchKey to unwatchKey)
	bitMade                         // the watch knows the key's create revision (rev)
	bitCheck                        // the key needs a read once made (the watch started afresh while it was made)
	bitReleasing                    // our release is deleting the key
	bitReleased                     // state: released
	bitExpired                      // state: expired (its TTL timer, or found deleted by Refresh)
	bitFreed                        // the name was given back
	bitFired                        // the key was seen deleted, or its shared lease lost (set under the key watch's mutex)

	kindShift = 16 // the kind's place in handle.flags
)

// kind is the lock's kind.
func (h *handle) kind() backend.Kind { return backend.Kind(h.flags.Load() >> kindShift) }

// has reports whether h's flags hold every bit of b.
func (h *handle) has(b uint32) bool { return h.flags.Load()&b == b }

// set sets the bits b of h's flags.
func (h *handle) set(b uint32) { h.flags.Or(b) }

// clear clears the bits b of h's flags.
func (h *handle) clear(b uint32) { h.flags.And(^b) }

// freed reports whether h's name was given back.
func (h *handle) freed() bool { return h.has(bitFreed) }

const (
	held = iota
	released
	expired
)

// state is h's state: held, released or expired. The key watch's mutex
// is held.
func (h *handle) state() int {
	switch {
	case h.has(bitReleased):
		return released
	case h.has(bitExpired):
		return expired
	}
	return held
}

// setState moves h to released or expired. The key watch's mutex is held.
func (h *handle) setState(s int) {
	h.clear(bitReleased | bitExpired)
	switch s {
	case released:
		h.set(bitReleased)
	case expired:
		h.set(bitExpired)
	}
}

// resource is the Resource that holds h.
func (h *handle) resource() *Resource {
	if h.sess != nil {
		return h.sess.r
	}
	return h.x.r
}

// leaseID is the lease of h's key.
func (h *handle) leaseID() clientv3.LeaseID {
	if h.sess != nil {
		return h.sess.id
	}
	return h.x.lease
}

// ttl is the granted TTL of h's lease (of its locks, for a shared lease).
func (h *handle) ttl() time.Duration {
	if h.sess != nil {
		return h.sess.ttl
	}
	return h.x.ttl
}

// limit is a semaphore's limit, 0 for the other kinds.
func (h *handle) limit() int {
	if h.kind() != backend.KindSemaphore {
		return 0
	}
	return int(h.x.limit)
}

// newHandle makes the handle of an acquisition of l, on the shared lease
// s, or (s nil) on the lease id of its own, granted for ttl, and gives it
// a free name (take).
func (r *Resource) newHandle(l *backend.Lease, s *session, id clientv3.LeaseID, ttl time.Duration) *handle {
	h := &handle{lockKey: l.Key, sess: s}
	h.flags.Store(uint32(l.Kind) << kindShift)
	if s == nil {
		h.x = &extra{r: r, lease: id, ttl: ttl}
	}
	if l.Kind == backend.KindSemaphore {
		if h.x == nil {
			h.x = &extra{}
		}
		h.x.limit = l.Limit
	}
	r.take(h)
	return h
}

// qname is a queue key, made by name when a request needs it:
// key[:dirLen] is the queue's directory (dir), key[:nsLen] the name
// space of its name, the directory and the kind's tag (ns).
type qname struct {
	key           string
	dirLen, nsLen int32
}

// dir is the directory of the queue.
func (q qname) dir() string { return q.key[:q.dirLen] }

// ns is the name space of the name: its directory and its kind's tag.
func (q qname) ns() string { return q.key[:q.nsLen] }

// name makes h's queue key in one allocation:
// <prefix><kind's directory><encoded key>/<tag><resource id>-<slot>.
func (r *Resource) name(h *handle) qname {
	var kd string
	switch h.kind() {
	case backend.KindSemaphore:
		kd = semDir
	case backend.KindRead, backend.KindWrite:
		kd = rwDir
	}
	var tb [semTagLen]byte
	tg := appendTag(tb[:0], h.kind(), h.limit())
	var sb [12]byte
	slot := strconv.AppendInt(sb[:0], int64(h.slot), 10)
	var b strings.Builder
	b.Grow(len(r.prefix) + len(kd) + encodedLen(h.lockKey) + 1 + len(tg) + len(r.id) + 1 + len(slot))
	b.WriteString(r.prefix)
	b.WriteString(kd)
	writeEncoded(&b, h.lockKey)
	b.WriteByte('/')
	dirLen := b.Len()
	b.Write(tg)
	nsLen := b.Len()
	b.WriteString(r.id)
	b.WriteByte('-')
	b.Write(slot)
	return qname{key: b.String(), dirLen: int32(dirLen), nsLen: int32(nsLen)}
}

// value is what h's key holds (entryValue) for the owner value and label.
func (h *handle) value(owner, label string) string {
	return entryValue(owner, label, h.limit(), h.ttl())
}

// parseName reads a key under the Resource's prefix: the kind, limit,
// lock key and slot of a handle, when it is one of this Resource's queue
// keys (see name), else ok is false.
func (r *Resource) parseName(key string) (kind backend.Kind, limit int, lockKey string, slot int, ok bool) {
	rest, found := strings.CutPrefix(key, r.prefix)
	if !found {
		return 0, 0, "", 0, false
	}
	kind = backend.KindMutex
	switch {
	case strings.HasPrefix(rest, semDir):
		kind, rest = backend.KindSemaphore, rest[len(semDir):]
	case strings.HasPrefix(rest, rwDir):
		kind, rest = backend.KindRead, rest[len(rwDir):]
	case strings.HasPrefix(rest, "!"): // fence keys
		return 0, 0, "", 0, false
	}
	i := strings.IndexByte(rest, '/')
	if i < 0 {
		return 0, 0, "", 0, false
	}
	enc, nm := rest[:i], rest[i+1:]
	j := strings.LastIndexByte(nm, '-')
	if j < len(r.id) || nm[j-len(r.id):j] != r.id {
		return 0, 0, "", 0, false
	}
	digits := nm[j+1:]
	if digits == "" || len(digits) > 9 || len(digits) > 1 && digits[0] == '0' {
		return 0, 0, "", 0, false
	}
	for k := 0; k < len(digits); k++ {
		if digits[k] < '0' || digits[k] > '9' {
			return 0, 0, "", 0, false
		}
		slot = slot*10 + int(digits[k]-'0')
	}
	tg := nm[:j-len(r.id)]
	switch kind {
	case backend.KindMutex:
		if tg != "" {
			return 0, 0, "", 0, false
		}
	case backend.KindRead:
		switch tg {
		case readTag:
		case writeTag:
			kind = backend.KindWrite
		default:
			return 0, 0, "", 0, false
		}
	case backend.KindSemaphore:
		var lok bool
		if limit, lok = semTagLimit(tg); !lok || len(tg) != semTagLen {
			return 0, 0, "", 0, false
		}
	}
	lockKey, ok = decodeKey(enc)
	return kind, limit, lockKey, slot, ok
}

// nameTable is the set of handles whose names are in use (from take to
// free), by name space, for the key watch. A chained hash table whose
// chains run through the handles (handle.next): a lock costs a word of
// the bucket array (at most 2 handles a bucket on average), not a map
// entry keyed by a string of its own. It is guarded by the key watch's
// mutex.
type nameTable struct {
	seed    maphash.Seed
	buckets []*handle
	n       int
}

// hash is the hash of a name space: the lock's kind, limit and key.
func (t *nameTable) hash(kind backend.Kind, limit int, key string) uint64 {
	return maphash.String(t.seed, key) ^ (uint64(kind)<<32|uint64(uint32(limit)))*0x9e3779b97f4a7c15
}

// bucket is the bucket of a name space.
func (t *nameTable) bucket(kind backend.Kind, limit int, key string) **handle {
	return &t.buckets[t.hash(kind, limit, key)&uint64(len(t.buckets)-1)]
}

// sameSpace reports whether h's name is in the name space (kind, limit, key).
func sameSpace(h *handle, kind backend.Kind, limit int, key string) bool {
	return h.kind() == kind && h.limit() == limit && h.lockKey == key
}

// insert adds h, growing the table when it holds more than 2 handles a bucket.
func (t *nameTable) insert(h *handle) {
	if t.buckets == nil {
		t.seed = maphash.MakeSeed()
		t.buckets = make([]*handle, 16)
	}
	if t.n >= 2*len(t.buckets) {
		old := t.buckets
		t.buckets = make([]*handle, 2*len(old))
		for _, c := range old {
			for c != nil {
				next := c.next
				b := t.bucket(c.kind(), c.limit(), c.lockKey)
				c.next, *b = *b, c
				c = next
			}
		}
	}
	b := t.bucket(h.kind(), h.limit(), h.lockKey)
	h.next, *b = *b, h
	t.n++
}

// remove takes h out of the table, if it is in.
func (t *nameTable) remove(h *handle) {
	if t.buckets == nil {
		return
	}
	for p := t.bucket(h.kind(), h.limit(), h.lockKey); *p != nil; p = &(*p).next {
		if *p == h {
			*p, h.next = h.next, nil
			t.n--
			return
		}
	}
}

// find returns the handle of the name (kind, limit, key, slot), or nil.
func (t *nameTable) find(kind backend.Kind, limit int, key string, slot int) *handle {
	if t.buckets == nil {
		return nil
	}
	for h := *t.bucket(kind, limit, key); h != nil; h = h.next {
		if int(h.slot) == slot && sameSpace(h, kind, limit, key) {
			return h
		}
	}
	return nil
}

// each calls f for every handle in the table.
func (t *nameTable) each(f func(h *handle)) {
	for _, h := range t.buckets {
		for ; h != nil; h = h.next {
			f(h)
		}
	}
}

// take gives h the lowest slot free in its name space and puts it in the
// table of names in use. The names of a Resource's queue keys are given
// out again once the key they named is known deleted (free): etcd keeps a
// deleted key in its index until the next compaction, and every acquire
// reads the whole queue directory, so a fresh name per acquisition (a
// lease ID, a counter) makes acquires of a hot lock slower and slower
// until the cluster compacts: 70 µs more per acquire after 5000 cycles,
// measured. Reused names keep the directory at one entry per concurrent
// acquisition per process.
func (r *Resource) take(h *handle) {
	w := &r.watch
	w.mu.Lock()
	defer w.mu.Unlock()
	t := &w.names
	kind, limit := h.kind(), h.limit()
	var low uint64 // slots 0-63 in use
	n := 0         // slots in use
	if t.buckets != nil {
		for c := *t.bucket(kind, limit, h.lockKey); c != nil; c = c.next {
			if sameSpace(c, kind, limit, h.lockKey) {
				n++
				if c.slot < 64 {
					low |= 1 << c.slot
				}
			}
		}
	}
	slot := bits.TrailingZeros64(^low)
	if slot == 64 { // 64 acquisitions of one lock at once: one of 64..n is free
		used := make([]bool, n+1)
		for c := *t.bucket(kind, limit, h.lockKey); c != nil; c = c.next {
			if sameSpace(c, kind, limit, h.lockKey) && int(c.slot) <= n {
				used[c.slot] = true
			}
		}
		for slot = 64; used[slot]; slot++ {
		}
	}
	h.slot = int32(slot)
	t.insert(h)
}

// free gives h's name back, once, after its key is known deleted.
func (r *Resource) free(h *handle) {
	if h.flags.Or(bitFreed)&bitFreed == 0 {
		w := &r.watch
		w.mu.Lock()
		w.names.remove(h)
		w.mu.Unlock()
	}
}

// freeLocked is free with the key watch's mutex held.
func (r *Resource) freeLocked(h *handle) {
	if h.flags.Or(bitFreed)&bitFreed == 0 {
		r.watch.names.remove(h)
	}
}
