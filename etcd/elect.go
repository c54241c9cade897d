package etcd

import (
	"context"
	"errors"
	"fmt"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/distlock/distlock/backend"
)

var (
	_ backend.Relabeler = (*Resource)(nil)
	_ backend.Watcher   = (*Resource)(nil)
)

// Relabel implements [backend.Relabeler] for mutexes: in one transaction,
// if our queue key is still the one we made (its create revision is the
// token), it puts the key's value again with l.Label, on the lease the
// key has. The key's create revision, and so the token and its place in
// the queue, stay; a waiter, which waits for its predecessor's deletion,
// is not woken. It returns [backend.ErrNotHeld] when the key is gone, an
// error wrapping errors.ErrUnsupported for another kind (before any I/O),
// and returns when ctx ends.
func (r *Resource) Relabel(ctx context.Context, l *backend.Lease) error {
	if r == nil || r.c == nil {
		return errNilClient
	}
	if l.Kind != backend.KindMutex {
		return fmt.Errorf("etcd: relabel %v %q: %w", l.Kind, l.Key, errors.ErrUnsupported)
	}
	h, ok := l.Handle.(*handle)
	if !ok || h == nil {
		return backend.ErrNotHeld
	}
	if r.clientClosed() {
		return fmt.Errorf("etcd: relabel %q: client closed", l.Key)
	}
	key := r.name(h).key
	resp, err := r.c.Txn(ctx).
		If(clientv3.Compare(clientv3.CreateRevision(key), "=", h.rev)).
		Then(clientv3.OpPut(key, h.value(l.Value, l.Label), clientv3.WithIgnoreLease())).
		Commit()
	if err != nil {
		return fmt.Errorf("etcd: relabel %q: %w", l.Key, err)
	}
	if !resp.Succeeded {
		return backend.ErrNotHeld
	}
	return nil
}

// Watch implements [backend.Watcher]: a watch on key's mutex queue (its
// directory, every put and deletion: a grant, a release, an expiry, a
// relabel, a waiter queuing), from a goroutine the Resource owns, which
// sends one notice once the watch is created and one per event. A watch
// that breaks (compaction, a lost connection) is made again after a pause,
// with a notice. It ends with cancel, [Resource.Close] or the client's
// Close; ch is nil when the Resource or its client is closed.
func (r *Resource) Watch(key string) (<-chan struct{}, func()) {
	if r == nil || r.c == nil || r.clientClosed() {
		return nil, func() {}
	}
	ch := make(chan struct{}, 1)
	wctx, cancel := context.WithCancel(context.Background())
	dir := r.queueDir(backend.KindMutex, key)
	if !r.background(func(ctx context.Context) {
		defer context.AfterFunc(ctx, cancel)()
		r.watchQueueDir(wctx, dir, ch)
	}) {
		cancel()
		return nil, func() {}
	}
	return ch, cancel
}

// watchQueueDir notifies ch of every change in dir until ctx ends or the
// client is closed.
func (r *Resource) watchQueueDir(ctx context.Context, dir string, ch chan<- struct{}) {
	notify := func() {
		select {
		case ch <- struct{}{}:
		default:
		}
	}
	for pause := 50 * time.Millisecond; ; pause = min(2*pause, time.Second) {
		for wr := range r.c.Watch(ctx, dir, clientv3.WithPrefix(), clientv3.WithCreatedNotify()) {
			if wr.Canceled || wr.CompactRevision != 0 {
				break
			}
			if wr.Created || len(wr.Events) > 0 {
				notify()
				pause = 50 * time.Millisecond
			}
		}
		if ctx.Err() != nil || r.clientClosed() {
			return
		}
		notify() // what happened while it was down
		t := time.NewTimer(pause)
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-t.C:
		}
	}
}
