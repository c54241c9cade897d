package zookeeper

import (
	"cmp"
	"slices"
	"strconv"
	"strings"

	"github.com/distlock/distlock/backend"
)

// The queue of a lock is the set of children of its parent znode, in the
// order of their sequence numbers. Each kind of lock has a parent of its
// own, so that a key's mutex, semaphore and read/write lock are distinct
// locks: "<root>/<key>" for the mutex (the name it always had),
// "<root>/<key>%sem" for the semaphore and "<root>/<key>%rw" for the
// read/write lock. An escaped key never holds '%' followed by a lowercase
// letter (it escapes '%' as %25, and writes its escapes in uppercase
// hex), so no key's parent is another key's parent of another kind.
const (
	semSuffix = "%sem"
	rwSuffix  = "%rw"
)

// Children are named like Curator's protected lock nodes:
// "_c_" + guid + "-" + tag + "-" + the server's sequence number (ten
// digits, or a sign and more after 2^31-1 creates: see sequence).
// The tag says what the child asks for: "lock" (a mutex), "read" or
// "write" (a read/write lock), "sem<limit>" (a semaphore's permit, with
// the limit its holder asked for), so that one listing tells every
// waiter all it needs, with no read of another child's data.
const (
	guidPrefix = "_c_"
	seqDigits  = 10
	mutexTag   = "lock"
	readTag    = "read"
	writeTag   = "write"
	semTag     = "sem"
)

// tagOf returns the tag of a child for l.
func tagOf(l *backend.Lease) string {
	if l.Kind == backend.KindSemaphore {
		return semTag + strconv.Itoa(int(l.Limit))
	}
	return fixedTag(l.Kind)
}

// fixedTag is the tag of a child of kind, but for a semaphore's (whose
// tag has its limit).
func fixedTag(kind backend.Kind) string {
	switch kind {
	case backend.KindRead:
		return readTag
	case backend.KindWrite:
		return writeTag
	}
	return mutexTag
}

// appendTag appends the tag of a child of kind and limit to b.
func appendTag(b []byte, kind backend.Kind, limit int) []byte {
	if kind == backend.KindSemaphore {
		return strconv.AppendInt(append(b, semTag...), int64(limit), 10)
	}
	return append(b, fixedTag(kind)...)
}

// tagLen is the length of the tag of a child of kind and limit.
func tagLen(kind backend.Kind, limit int) int {
	var t [16]byte
	return len(appendTag(t[:0], kind, limit))
}

// writeTagTo writes the tag of a child of kind and limit to b.
func writeTagTo(b *strings.Builder, kind backend.Kind, limit int) {
	var t [16]byte
	b.Write(appendTag(t[:0], kind, limit))
}

// sequence returns the sequence number of a lock child and the length
// of its text at the end of the name, false for a name that does not end
// in one (not a contender). ZooKeeper appends the parent's child version,
// a signed 32-bit counter, with "%010d": after 2^31-1 creates under one
// parent (a container znode lives as long as its queue is never empty)
// the counter goes on from -2147483648, written after the name's own '-'
// in eleven characters ("-2147483648" ... "-1000000000"), then in ten
// ("-999999999" ... "-000000001"), then "0000000000" again. The number is
// returned as the counter's 32 bits, which seqCompare orders across the
// wrap.
func sequence(name string) (seq uint32, n int, ok bool) {
	if len(name) < seqDigits {
		return 0, 0, false
	}
	field := name[len(name)-seqDigits:]
	if field[0] == '-' { // "-999999999" ... "-000000001" after the name's '-'
		u, err := strconv.ParseUint(field[1:], 10, 32)
		if err != nil || u == 0 || len(name) == seqDigits || name[len(name)-seqDigits-1] != '-' {
			return 0, 0, false
		}
		return uint32(-int32(u)), seqDigits, true
	}
	u, err := strconv.ParseUint(field, 10, 64)
	if err != nil {
		return 0, 0, false
	}
	if u >= 1e9 && u <= 1<<31 && len(name) >= seqDigits+2 && name[len(name)-seqDigits-2:len(name)-seqDigits] == "--" {
		return uint32(-int64(u)), seqDigits + 1, true // "-2147483648" ... "-1000000000" after the name's '-'
	}
	if u >= 1<<31 {
		return 0, 0, false
	}
	return uint32(u), seqDigits, true
}

// seqCompare orders two sequence numbers by serial number arithmetic
// (RFC 1982): a before b when b is fewer than 2^31 creates after a, so
// that the queue keeps its order when the counter wraps. Children alive
// at once are never that far apart.
func seqCompare(a, b uint32) int {
	return cmp.Compare(int32(a-b), 0)
}

// entry is one contender in a queue.
type entry struct {
	name  string
	seq   uint32 // see sequence
	kind  backend.Kind
	limit int // a semaphore's: the limit its holder asked for; 0 if unreadable
}

// parseEntry reads a child of a parent of kind. Every child with a
// sequence number contends. In the mutex queue, every such child is a
// mutex (as ZooKeeper's and Curator's lock recipes name theirs), whatever
// its tag. In the others, a tag this package does not write counts
// against the others: in a read/write queue as a writer, in a semaphore's
// as a permit of another limit. A stranger can then only make others
// wait or fail, never let too many in.
func parseEntry(name string, kind backend.Kind) (entry, bool) {
	seq, n, ok := sequence(name)
	if !ok {
		return entry{}, false
	}
	e := entry{name: name, seq: seq, kind: kind}
	tag := tagIn(name[:len(name)-n])
	switch kind {
	case backend.KindRead, backend.KindWrite:
		e.kind = backend.KindWrite
		if tag == readTag {
			e.kind = backend.KindRead
		}
	case backend.KindSemaphore:
		if n, ok := strings.CutPrefix(tag, semTag); ok {
			if limit, err := strconv.Atoi(n); err == nil && limit >= 1 && strconv.Itoa(limit) == n {
				e.limit = limit
			}
		}
	default:
		e.kind = backend.KindMutex
	}
	return e, true
}

// tagIn returns the tag of a name "..-<tag>-" (without its sequence
// number), "" when it has none.
func tagIn(name string) string {
	rest, ok := strings.CutSuffix(name, "-")
	if !ok {
		return ""
	}
	i := strings.LastIndexByte(rest, '-')
	if i < 0 {
		return ""
	}
	return rest[i+1:]
}

// queueOf parses and orders the children of a parent of kind.
func queueOf(children []string, kind backend.Kind) []entry {
	q := make([]entry, 0, len(children))
	for _, c := range children {
		if e, ok := parseEntry(c, kind); ok {
			q = append(q, e)
		}
	}
	slices.SortFunc(q, func(a, b entry) int {
		return cmp.Or(seqCompare(a.seq, b.seq), strings.Compare(a.name, b.name))
	})
	return q
}

// verdict is what a contender's place in its queue tells it.
type verdict struct {
	hold     bool // it holds the lock
	mismatch bool // a semaphore's: a child before it asked for another limit
	// watch is the child to wait for: the waiter lists again when it
	// changes or goes. Empty with children set: wait for any change of
	// the queue (the child watch its listing set).
	watch    string
	children bool
	// signal: the watched child marks its grant (a data change, see
	// grantSignal), after which the waiter lists again.
	signal bool
	// alone: the watched child is the only one between the waiter and
	// the lock, so that its deletion grants the lock with no listing
	// (nothing queues before a child once it is made).
	alone bool
}

// judge tells the contender at index i of q, asking for kind (and limit,
// for a semaphore), whether it holds and what it waits for. Every rule
// admits a prefix of the queue, so the store grants in queue order:
//
//   - mutex, write: it holds when it is first; it waits for its immediate
//     predecessor, whose deletion it needs.
//   - read: it holds when no writer precedes it; it waits for the last
//     writer before it, whose deletion it needs (etcd's recipe RWMutex).
//   - semaphore of limit L: it fails with a mismatch when a child before
//     it asked for another limit, and holds when fewer than L precede it.
//     No single predecessor's deletion is needed (any of them lets it
//     in), so watching one cannot do: the first waiter (L predecessors,
//     all holders) waits for any change of the queue, through the child
//     watch of its listing, as Curator's InterProcessSemaphoreV2 does;
//     the waiters behind it wait for their immediate predecessor, which
//     marks its grant when it gets the lock (grantSignal), or goes. For
//     L = 1 that is the mutex rule.
func judge(q []entry, i int, kind backend.Kind, limit int) verdict {
	switch kind {
	case backend.KindRead:
		for j := i - 1; j >= 0; j-- {
			if q[j].kind != backend.KindRead {
				alone := true
				for _, e := range q[:j] {
					alone = alone && e.kind == backend.KindRead
				}
				return verdict{watch: q[j].name, alone: alone}
			}
		}
		return verdict{hold: true}
	case backend.KindSemaphore:
		for j := range i {
			if q[j].limit != limit {
				return verdict{mismatch: true}
			}
		}
		switch {
		case i < limit:
			return verdict{hold: true}
		case limit == 1:
			return verdict{watch: q[i-1].name, alone: i == 1}
		case i == limit:
			return verdict{children: true}
		}
		return verdict{watch: q[i-1].name, signal: true}
	}
	if i == 0 {
		return verdict{hold: true}
	}
	return verdict{watch: q[i-1].name, alone: i == 1}
}

// grantSignal reports whether the holder at index i of q, granted a
// permit of a semaphore of limit, marks its grant for the waiter behind
// it (which waits for that, see judge): when there is one and the limit
// is above 1.
func grantSignal(q []entry, i int, kind backend.Kind, limit int) bool {
	return kind == backend.KindSemaphore && limit > 1 && i < len(q)-1
}

// holders returns the indexes of q that hold the lock, by judge's rules.
func holders(q []entry, kind backend.Kind) []int {
	var hs []int
	switch kind {
	case backend.KindSemaphore:
		if len(q) == 0 {
			return nil
		}
		limit := q[0].limit
		for i := 0; i < len(q) && i < limit && q[i].limit == limit; i++ {
			hs = append(hs, i)
		}
	case backend.KindRead, backend.KindWrite:
		for i, e := range q {
			if e.kind != backend.KindRead {
				if i == 0 {
					hs = append(hs, 0)
				}
				break
			}
			hs = append(hs, i)
		}
	default:
		if len(q) > 0 {
			hs = append(hs, 0)
		}
	}
	return hs
}
