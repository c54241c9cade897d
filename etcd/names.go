package etcd

import (
	"math/bits"
	"strconv"
	"sync"
	"time"

	"github.com/distlock/distlock/backend"
)

// names hands out the names of a Resource's queue keys, and gives a name
// out again once the key it named is known deleted. etcd keeps a deleted
// key in its index until the next compaction, and every acquire reads the
// whole queue directory, so a fresh name per acquisition (a lease ID, a
// counter) makes acquires of a hot lock slower and slower until the
// cluster compacts: 70 µs more per acquire after 5000 cycles, measured.
// Reused names keep the directory at one entry per concurrent acquisition
// per process.
type names struct {
	mu    sync.Mutex
	used  map[string]uint64 // name space (a queue directory and a tag) -> slots 0-63 in use, a bit each
	extra map[string][]bool // name space -> slots from 64 on in use (64 acquisitions of one lock at once)
}

// take returns a free slot in the name space key and marks it used. A
// new name space is kept in the map under key, which is therefore best a
// part of the string of the queue key (so that the map holds no copy).
func (n *names) take(key string) int {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.used == nil {
		n.used = make(map[string]uint64)
	}
	used := n.used[key]
	if free := ^used; free != 0 {
		slot := bits.TrailingZeros64(free)
		n.used[key] = used | 1<<slot
		return slot
	}
	if n.extra == nil {
		n.extra = make(map[string][]bool)
	}
	s := n.extra[key]
	for i, u := range s {
		if !u {
			s[i] = true
			return 64 + i
		}
	}
	n.extra[key] = append(s, true)
	return 64 + len(s)
}

// give marks slot of key free again.
func (n *names) give(key string, slot int) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if slot >= 64 {
		s := n.extra[key]
		if slot-64 >= len(s) {
			return
		}
		s[slot-64] = false
		for _, u := range s {
			if u {
				return
			}
		}
		delete(n.extra, key)
		return
	}
	used := n.used[key] &^ (1 << slot)
	if used == 0 && len(n.extra[key]) == 0 {
		delete(n.used, key)
		return
	}
	n.used[key] = used
}

// newHandle names a queue key for l, whose lease lasts ttl: in the
// directory of l's kind, with l's kind's tag. The key's directory and
// name space are parts of the key's string.
func (r *Resource) newHandle(l *backend.Lease, ttl time.Duration) *handle {
	dir := r.queueDir(l.Kind, l.Key)
	limit := 0
	if l.Kind == backend.KindSemaphore {
		limit = int(l.Limit)
	}
	tag := tag(l.Kind, limit)
	nsLen := len(dir) + len(tag)
	// Most acquisitions take slot 0: name it first, so that a new name
	// space is kept under a part of the key's string.
	key := dir + tag + r.id + "-0"
	slot := r.names.take(key[:nsLen])
	if slot != 0 {
		key = key[:nsLen] + r.id + "-" + strconv.Itoa(slot)
	}
	return &handle{r: r, key: key, dirLen: int32(len(dir)), nsLen: int32(nsLen), slot: int32(slot), ttl: ttl,
		kind: l.Kind, limit: int32(limit), owner: l.Value, label: l.Label}
}

// dir is the directory of h's queue.
func (h *handle) dir() string { return h.key[:h.dirLen] }

// ns is the name space of h's name: its directory and its kind's tag.
func (h *handle) ns() string { return h.key[:h.nsLen] }

// value is what h's key holds (entryValue).
func (h *handle) value() string { return entryValue(h.owner, h.label, int(h.limit), h.ttl) }

// free gives h's name back, once, after its key is known deleted.
func (r *Resource) free(h *handle) {
	if h.freed.CompareAndSwap(false, true) {
		r.names.give(h.ns(), int(h.slot))
	}
}
