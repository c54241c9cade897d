package sqldb

import (
	"context"
	"database/sql"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/distlock/distlock/backend"
)

var (
	_ backend.Relabeler = (*Postgres)(nil)
	_ backend.Relabeler = (*MySQL)(nil)
)

// Relabel implements [backend.Relabeler] for mutexes with one UPDATE of
// the lock's row: its label becomes l.Label if the row holds l.Value and
// is live by the database's clock; expiry and token stay. It returns
// [backend.ErrNotHeld] when it does not, an error wrapping
// errors.ErrUnsupported for another kind (before any I/O), and returns
// when ctx ends.
func (p *Postgres) Relabel(ctx context.Context, l *backend.Lease) error {
	if l.Kind != backend.KindMutex {
		return fmt.Errorf("sqldb: postgres: relabel %v %q: %w", l.Kind, l.Key, errors.ErrUnsupported)
	}
	if err := p.ValidateKey(l.Key); err != nil {
		return err
	}
	var tag pgconn.CommandTag
	err := retryConflicts(pgContention, func() (err error) {
		tag, err = p.pool.Exec(ctx, p.mutex(l.Key).relabel, keyArg(l.Key), l.Value, []byte(l.Label))
		return err
	})
	if err != nil {
		return fmt.Errorf("sqldb: postgres: relabel %q: %w", l.Key, err)
	}
	if tag.RowsAffected() == 0 {
		return backend.ErrNotHeld
	}
	return nil
}

// Relabel implements [backend.Relabeler] for mutexes with one UPDATE of
// the lock's row: its label becomes l.Label if the row holds l.Value and
// is live by the server's clock; expiry and token stay. MySQL counts only
// the rows an UPDATE changed, so when it changed none (the label was
// already l.Label, or the row is not ours) a read tells which. It returns
// [backend.ErrNotHeld] when the row is not held for l.Value, an error
// wrapping errors.ErrUnsupported for another kind (before any I/O), and
// returns when ctx ends.
func (m *MySQL) Relabel(ctx context.Context, l *backend.Lease) error {
	if l.Kind != backend.KindMutex {
		return fmt.Errorf("sqldb: mysql: relabel %v %q: %w", l.Kind, l.Key, errors.ErrUnsupported)
	}
	if err := m.validate(l); err != nil {
		return err
	}
	var n int64
	err := retryConflicts(myContention, func() error {
		res, err := m.db.ExecContext(ctx, m.relabel, []byte(l.Label), l.Key, l.Value)
		if err == nil {
			n, err = res.RowsAffected()
		}
		return err
	})
	if err == nil && n == 0 {
		var one int
		switch err = m.db.QueryRowContext(ctx, m.held, l.Key, l.Value).Scan(&one); {
		case errors.Is(err, sql.ErrNoRows):
			return backend.ErrNotHeld
		case err == nil:
			return nil // the label was l.Label already
		}
	}
	if err != nil {
		return fmt.Errorf("sqldb: mysql: relabel %q: %w", l.Key, err)
	}
	return nil
}
