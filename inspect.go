package distlock

import (
	"context"
	"fmt"

	"github.com/distlock/distlock/backend"
)

// Holder is one holder of a lock, as inspection shows it.
type Holder = backend.Holder

// Info is what the store holds of a lock, read without taking it.
type Info struct {
	// Key and Kind name the lock (for a read/write lock, KindWrite: its
	// holders are readers and writers).
	Key  string
	Kind Kind
	// Holders lists the live holders, each with its kind, token, time
	// left by the store's clock and label ([WithLabel]); empty when free.
	Holders []Holder
	// Limit is a semaphore's limit while it has holders.
	Limit int
}

// Held reports whether the lock has a holder.
func (i Info) Held() bool { return len(i.Holders) > 0 }

// Inspect reads who holds key's mutex, without taking it: held or not, and
// the holder's token, time left and label. It is one request, bounded by
// ctx and by the bound of one attempt (1s, as a TryLock with no wait).
//
// Errors: an [ErrInvalid] error for a bad key or nil ctx, with no I/O;
// [ErrUnsupported] when the store cannot tell; otherwise the store's error.
func (d *DistributeLock) Inspect(ctx context.Context, key string) (Info, error) {
	if err := checkNotElection(key); err != nil {
		return Info{}, err
	}
	return d.inspect(ctx, key, KindMutex)
}

// Inspect reads the semaphore's holders, as [DistributeLock.Inspect] does,
// with the limit they took it with.
func (s *Semaphore) Inspect(ctx context.Context) (Info, error) {
	return s.d.inspect(ctx, s.key, KindSemaphore)
}

// Inspect reads the read/write lock's holders, readers and writers, as
// [DistributeLock.Inspect] does.
func (rw *RWMutex) Inspect(ctx context.Context) (Info, error) {
	return rw.d.inspect(ctx, rw.key, KindWrite)
}

func (d *DistributeLock) inspect(ctx context.Context, key string, kind Kind) (Info, error) {
	if _, err := d.checkCall(ctx, key, 0); err != nil {
		return Info{}, err
	}
	if err := d.checkKind(key, kind, 1); err != nil {
		return Info{}, err
	}
	if err := d.checkKey(key); err != nil {
		return Info{}, err
	}
	in, ok := d.res.(backend.Inspector)
	if !ok {
		return Info{}, fmt.Errorf("%w: %T cannot tell who holds a lock", ErrUnsupported, d.res)
	}
	if d.isClosed() {
		return Info{}, ErrClosed
	}
	ctx, cancel := context.WithTimeout(ctx, attemptBound)
	defer cancel()
	got, err := in.Inspect(ctx, key, kind)
	if err != nil {
		return Info{}, err
	}
	return Info{Key: key, Kind: kind, Holders: got.Holders, Limit: got.Limit}, nil
}
