package zookeeper

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/go-zookeeper/zk"

	"github.com/distlock/distlock/backend"
)

var (
	_ backend.Relabeler = (*Resource)(nil)
	_ backend.Watcher   = (*Resource)(nil)
)

// Relabel implements [backend.Relabeler] for mutexes: one write of the
// lock's znode's data, its record with l.Label (see "Inspection" in the
// package doc), if the znode still exists under its session. The znode,
// and so its czxid (the token) and its place in the queue, stay. The
// record's write time dates the TTL of a lock its session does not keep
// alive (Inspect counts the time left from it), so Relabel also pushes
// that TTL back by l.TTL, as Refresh does. It returns
// [backend.ErrNotHeld] when the znode is gone or the lock was reported
// lost, an error wrapping errors.ErrUnsupported for another kind (before
// any I/O), and ctx's error as soon as ctx ends (the write goes on
// unwatched).
func (r *Resource) Relabel(ctx context.Context, l *backend.Lease) error {
	if l.Kind != backend.KindMutex {
		return fmt.Errorf("zookeeper: relabel %v %q: %w", l.Kind, l.Key, errors.ErrUnsupported)
	}
	path, h, err := r.handle("relabel", l)
	if err != nil {
		return err
	}
	if h == nil {
		return backend.ErrNotHeld
	}
	sent := time.Now()
	data := recordOf(l).encode()
	stat, err := call(ctx, func() (*zk.Stat, error) { return r.conn.Set(path, data, -1) })
	return r.answered("relabel", h, l, sent, stat, err)
}

// Watch implements [backend.Watcher] with ZooKeeper's one-shot watches,
// set again after each fires: a child watch on key's mutex queue (a
// grant, a release, a session's expiry, a waiter queuing), and a data
// watch on the child that holds (a relabel); while the queue's parent
// does not exist, a watch on its creation. A notice follows every time
// the watches are set (so the reader looks again after what happened
// while they were not) and every event. It ends with cancel or
// [Resource.Close]; a watch still armed then stays in the client until
// its znode changes (the protocol cannot remove one). ch is nil after
// Close.
func (r *Resource) Watch(key string) (<-chan struct{}, func()) {
	if r.conn == nil || r.isClosed() {
		return nil, func() {}
	}
	ch := make(chan struct{}, 1)
	ctx, cancel := context.WithCancel(context.Background())
	go r.watchQueue(ctx, r.kindParent(key, backend.KindMutex), ch)
	return ch, cancel
}

// watchQueue notifies ch of the changes of parent's queue and of its head
// until ctx ends or r closes.
func (r *Resource) watchQueue(ctx context.Context, parent string, ch chan<- struct{}) {
	type armed struct {
		children, head <-chan zk.Event
	}
	for pause := 50 * time.Millisecond; ; {
		w, err := call(ctx, func() (armed, error) {
			children, _, cev, err := r.conn.ChildrenW(parent)
			if errors.Is(err, zk.ErrNoNode) {
				_, _, cev, err = r.conn.ExistsW(parent)
				return armed{children: cev}, err
			}
			if err != nil {
				return armed{}, err
			}
			w := armed{children: cev}
			if q := queueOf(children, backend.KindMutex); len(q) > 0 {
				_, _, hev, err := r.conn.GetW(parent + "/" + q[0].name)
				if err != nil && !errors.Is(err, zk.ErrNoNode) { // gone: the child watch fires
					return armed{}, err
				}
				w.head = hev
			}
			return w, nil
		})
		select {
		case ch <- struct{}{}:
		default:
		}
		if err != nil {
			if sleep(ctx, r.stop, pause) != nil {
				return
			}
			pause = min(2*pause, time.Second)
			continue
		}
		pause = 50 * time.Millisecond
		select {
		case <-w.children:
		case <-w.head:
		case <-ctx.Done():
			return
		case <-r.stop:
			return
		}
	}
}
