package redis

import (
	"context"
	"errors"
	"fmt"

	"github.com/distlock/distlock/backend"
	"github.com/distlock/distlock/internal/redisscript"
)

var _ backend.Relabeler = (*Resource)(nil)

var relabelSHA any = redisscript.Relabel.Hash()

// Relabel implements [backend.Relabeler] for mutexes with one script call
// (redisscript.Relabel): if the lock holds l.Value, it writes l.Label as
// the holder's label (prefix{k'}:label, see "Inspection, labels and
// several keys"), with the lock's time left; the lock, its expiry and its
// token stay. It returns [backend.ErrNotHeld] when the key is gone or
// holds another value, an error wrapping errors.ErrUnsupported for
// another kind (before any I/O), and returns when ctx ends.
func (r *Resource) Relabel(ctx context.Context, l *backend.Lease) error {
	if r.c == nil {
		return errNilClient
	}
	if l.Kind != backend.KindMutex {
		return fmt.Errorf("redis: relabel %v %q: %w", l.Kind, l.Key, errors.ErrUnsupported)
	}
	c := scriptCall(redisscript.Relabel, relabelSHA, r.lockKey(l), l.Value, l.Label)
	n, _, err := r.send(ctx, c)
	if err != nil {
		return fmt.Errorf("redis: relabel %q: %w", l.Key, err)
	}
	if n == 0 {
		return backend.ErrNotHeld
	}
	return nil
}
