package distlock

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/distlock/distlock/backend"
)

// Election is a handle to the leader election of a name: among the
// candidates that campaign for it, across every process using the store,
// one at a time is the leader. Get one with [DistributeLock.Election]; it
// holds no state and costs nothing to make.
//
// A leadership is a held lock ([*Lock]) like any other, taken by
// [Election.Campaign]: its Token is the term, which strictly increases
// from leader to leader on one store (give it to the resources the leader
// writes to, which refuse a lower one: a leader paused past its TTL can do
// no harm); its Done closes when the leadership is lost; its Deadline,
// Extend and renewal ([WithAutoRenew]) are a lock's. Unlock resigns: the
// next candidate is elected at once (woken by the store's release notice
// or watch). The leader publishes a value (an address, an identity) with
// its leadership and changes it with [Election.Proclaim]; anyone reads
// the leader with [Election.Leader] and follows the changes with
// [Election.Observe]. [Election.Run] runs a function while leader, and
// campaigns again after it returns or the leadership is lost.
//
// An election of name is held by the store as the mutex of the key
// backend.ElectionPrefix + name ("distlock-election:" + name): the
// store's limits on keys apply to it, and mutex keys with that prefix are
// refused (they are elections'), so an election and a mutex are distinct
// locks. Handlers see a campaign as an acquisition of that key, of kind
// [KindElection]. The leader's published value is kept with its label
// ([WithLabel]) in the store; together they hold at most 252 bytes.
//
// Every store holds elections. Proclaim needs a store that can change the
// label of a held lock (backend.Relabeler: every store of this repository
// but Redlock), Leader and Observe one that tells who holds a lock
// (backend.Inspector: all of them). Redlock makes no tokens: there every
// term is 0, nothing can fence a stale leader, and Observe tells leaders
// apart only by their label and value.
type Election struct {
	d    *DistributeLock
	name string
}

// Election returns a handle to the election of name. An empty name, or
// one whose key the store cannot hold, makes its methods fail with
// [ErrInvalid].
func (d *DistributeLock) Election(name string) *Election {
	return &Election{d: d, name: name}
}

// Leader is the leader of an election, as [Election.Leader] and
// [Election.Observe] read it from the store.
type Leader struct {
	// Value is the value the leader published: its campaign's, or its
	// last Proclaim's.
	Value string
	// Label is the label of the leader's DistributeLock ([WithLabel]).
	Label string
	// Term is the leadership's fencing token (0 on a store without
	// tokens: Redlock).
	Term uint64
	// TTL is the time the leadership has left by the store's clock
	// unless renewed; 0 when the store cannot tell.
	TTL time.Duration
}

// ErrNoLeader is returned by [Election.Leader] when the election has no
// leader.
var ErrNoLeader = errors.New("distlock: no leader")

// maxPublished is how many bytes a leader's label and value hold
// together: the label the store keeps (backend.MaxLabelLen) less the
// length prefix that separates them (at most "256:").
const maxPublished = backend.MaxLabelLen - 4

// key is the key of the election's mutex.
func (e *Election) key() string { return backend.ElectionPrefix + e.name }

// check validates what every method of e takes: e, ctx and the name.
func (e *Election) check(ctx context.Context) error {
	switch {
	case e == nil || e.d == nil:
		return fmt.Errorf("%w: an Election not made by DistributeLock.Election", ErrInvalid)
	case ctx == nil:
		return fmt.Errorf("%w: nil context", ErrInvalid)
	case e.name == "":
		return fmt.Errorf("%w: empty election name", ErrInvalid)
	}
	if err := e.d.checkKey(e.key()); err != nil {
		return fmt.Errorf("election %s: %w", quote(e.name), err)
	}
	return nil
}

// label is what the store keeps with a leadership: the DistributeLock's
// label and the published value, as "<len(label)>:<label><value>".
func (e *Election) label(value string) (string, error) {
	l := e.d.cfg.label
	if len(l)+len(value) > maxPublished {
		return "", fmt.Errorf("%w: election %s: value of %d bytes: with the label (%d bytes) at most %d", ErrInvalid, quote(e.name), len(value), len(l), maxPublished)
	}
	return strconv.Itoa(len(l)) + ":" + l + value, nil
}

// parseLabel reads a leadership's label back into the DistributeLock's
// label and the published value; a label not made by label is all label.
func parseLabel(s string) (label, value string) {
	n, rest, ok := strings.Cut(s, ":")
	if !ok {
		return s, ""
	}
	i, err := strconv.Atoi(n)
	if err != nil || i < 0 || i > len(rest) || strconv.Itoa(i) != n {
		return s, ""
	}
	return rest[:i], rest[i:]
}

// Campaign waits until this candidate is elected, or ctx ends, and
// returns the leadership with value published. The leadership is a
// [*Lock] of the election's key (see [Election]): its Token is the term,
// its Done closes when the leadership is lost, Unlock resigns. Its TTL is
// the context's ([ContextWithTTL]) or the default, renewed under
// [WithAutoRenew].
//
// Candidates are elected in order of arrival where the store queues
// (etcd, ZooKeeper), and otherwise at their next attempt after a release
// notice or their spin (Redis, PostgreSQL, MySQL, Redlock). Campaign
// never reenters a leadership ctx carries ([ContextWithLock]): a
// candidate that leads already waits on itself.
//
// Errors: errors.Join([ErrNotAcquired], ctx.Err()) when ctx ends first;
// an [ErrInvalid] error for a bad name, a value that with the label
// exceeds 252 bytes, a TTL <= 0 or a nil ctx, with no I/O; [ErrClosed]
// after or during Close; otherwise the store's error.
func (e *Election) Campaign(ctx context.Context, value string) (*Lock, error) {
	if err := e.check(ctx); err != nil {
		return nil, err
	}
	label, err := e.label(value)
	if err != nil {
		return nil, err
	}
	d, key := e.d, e.key()
	ttl, err := d.checkCall(ctx, key, WaitForever)
	if err != nil {
		return nil, err
	}
	return d.acquireNew(ctx, key, nil, WaitForever, ttl, KindElection, 0, label)
}

// Proclaim publishes value as the leader's, in place of the one it
// published before, without a new election: the term stays. lead is the
// leadership Campaign returned. The change is made only while the store
// still holds the leadership for lead (compare-and-set), one at a time
// with its renewals.
//
// Errors: [ErrNotHeld] when the leadership is lost, released or expired
// (its Done closes; nothing is changed); an [ErrInvalid] error for a
// lead that is not a leadership of this election, a nil ctx, or a value
// that with the label exceeds 252 bytes, with no I/O; [ErrUnsupported]
// when the store cannot change a held lock's label (Redlock), with no I/O;
// otherwise the store's error, the value then unknown (Proclaim may be
// called again).
func (e *Election) Proclaim(ctx context.Context, lead *Lock, value string) error {
	if err := e.check(ctx); err != nil {
		return err
	}
	if lead == nil || lead.g == nil || lead.g.d != e.d || lead.g.lease.Key != e.key() || lead.g.lease.Kind != KindMutex || len(lead.g.subLeases()) > 1 {
		return fmt.Errorf("%w: not a leadership of election %s", ErrInvalid, quote(e.name))
	}
	label, err := e.label(value)
	if err != nil {
		return err
	}
	rl, ok := e.d.res.(backend.Relabeler)
	if !ok {
		return fmt.Errorf("%w: %T cannot change a held lock's label", ErrUnsupported, e.d.res)
	}
	return lead.g.relabel(ctx, rl, label)
}

// Leader reads who leads the election now, without campaigning: the
// leader's published value, label, term and time left.
//
// Errors: [ErrNoLeader] when the election has no leader; an [ErrInvalid]
// error for a bad name or nil ctx, with no I/O; [ErrUnsupported] when the
// store cannot tell who holds a lock; [ErrClosed] after Close; otherwise
// the store's error.
func (e *Election) Leader(ctx context.Context) (Leader, error) {
	in, err := e.inspector(ctx)
	if err != nil {
		return Leader{}, err
	}
	l, ok, err := e.read(ctx, in)
	switch {
	case err != nil:
		return Leader{}, err
	case !ok:
		return Leader{}, fmt.Errorf("%w: election %s", ErrNoLeader, quote(e.name))
	}
	return l, nil
}

// inspector checks what Leader and Observe take and returns the store's
// Inspector.
func (e *Election) inspector(ctx context.Context) (backend.Inspector, error) {
	if err := e.check(ctx); err != nil {
		return nil, err
	}
	in, ok := e.d.res.(backend.Inspector)
	if !ok {
		return nil, fmt.Errorf("%w: %T cannot tell who holds a lock", ErrUnsupported, e.d.res)
	}
	if e.d.isClosed() {
		return nil, ErrClosed
	}
	return in, nil
}

// read reads the leader: false when there is none.
func (e *Election) read(ctx context.Context, in backend.Inspector) (Leader, bool, error) {
	ctx, cancel := context.WithTimeout(ctx, attemptBound)
	defer cancel()
	got, err := in.Inspect(ctx, e.key(), KindMutex)
	if err != nil || len(got.Holders) == 0 {
		return Leader{}, false, err
	}
	h := got.Holders[0]
	label, value := parseLabel(h.Label)
	return Leader{Value: value, Label: label, Term: h.Token, TTL: h.TTL}, true, nil
}
