package sqldb

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/distlock/distlock/backend"
)

var (
	_ backend.KindChecker    = (*Postgres)(nil)
	_ backend.Withdrawer     = (*Postgres)(nil)
	_ backend.Inspector      = (*Postgres)(nil)
	_ backend.BatchRefresher = (*Postgres)(nil)
)

// Inspect implements backend.Inspector: it reads the lock of key and kind
// (a mutex's row; a semaphore's or read/write lock's row, whose live
// holders it lists with their tokens, labels and time left by the
// database's clock) in one statement, and writes nothing.
func (p *Postgres) Inspect(ctx context.Context, key string, kind backend.Kind) (backend.Inspection, error) {
	if err := p.ValidateKey(key); err != nil {
		return backend.Inspection{}, err
	}
	var in backend.Inspection
	if kind == backend.KindMutex {
		var (
			tok, left int64
			label     []byte
		)
		err := p.pool.QueryRow(ctx, p.mutex(key).inspect, keyArg(key)).Scan(&tok, &left, &label)
		switch {
		case errors.Is(err, pgx.ErrNoRows):
			return in, nil
		case err != nil:
			return in, fmt.Errorf("sqldb: postgres: inspect %q: %w", key, err)
		}
		in.Holders = []backend.Holder{{Kind: kind, Token: uint64(tok), TTL: time.Duration(left) * time.Microsecond, Label: string(label)}}
		return in, nil
	}
	var (
		state []byte
		lim   int32
		now   int64
	)
	err := p.pool.QueryRow(ctx, p.kInspect, bytesArg(key), groupRow(kind)).Scan(&state, &lim, &now)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return in, nil
	case err != nil:
		return in, fmt.Errorf("sqldb: postgres: inspect %q: %w", key, err)
	}
	st, err := parseState(state)
	if err == nil {
		in, err = st.inspection(now, int(lim))
	}
	if err != nil {
		return in, fmt.Errorf("sqldb: postgres: inspect %q: %w", key, err)
	}
	return in, nil
}

// RefreshAll implements backend.BatchRefresher: it extends the mutexes
// among ls in one statement per table (an UPDATE joined with the leases'
// keys, owners and TTLs as arrays, which returns the leases it renewed),
// and the other kinds' grants one statement each. A lease it did not
// renew gets an error wrapping backend.ErrNotHeld; a failed statement
// fails the leases it carried, and only those.
func (p *Postgres) RefreshAll(ctx context.Context, ls []*backend.Lease) []error {
	errs := make([]error, len(ls))
	var main, odd []int
	for i, l := range ls {
		switch {
		case p.ValidateKey(l.Key) != nil:
			errs[i] = p.ValidateKey(l.Key)
		case l.Kind != backend.KindMutex:
			errs[i] = p.Refresh(ctx, l)
		case textKey(l.Key):
			main = append(main, i)
		default:
			odd = append(odd, i)
		}
	}
	p.refreshBatch(ctx, &p.main, ls, main, errs)
	p.refreshBatch(ctx, &p.odd, ls, odd, errs)
	return errs
}

// refreshBatch renews the mutexes ls[idx] of m's table in one statement.
func (p *Postgres) refreshBatch(ctx context.Context, m *pgMutexSQL, ls []*backend.Lease, idx []int, errs []error) {
	if len(idx) == 0 {
		return
	}
	owners := make([]string, len(idx))
	ttls := make([]int64, len(idx))
	var keys any
	if m == &p.main {
		ks := make([]string, len(idx))
		for j, i := range idx {
			ks[j] = ls[i].Key
		}
		keys = ks
	} else {
		ks := make([][]byte, len(idx))
		for j, i := range idx {
			ks[j] = []byte(ls[i].Key)
		}
		keys = ks
	}
	for j, i := range idx {
		owners[j], ttls[j] = ls[i].Value, micros(ls[i].TTL)
	}
	renewed := make([]bool, len(idx))
	err := retryConflicts(pgContention, func() error {
		clear(renewed)
		rows, err := p.pool.Query(ctx, m.refAll, keys, owners, ttls)
		if err != nil {
			return err
		}
		var n int64
		_, err = pgx.ForEachRow(rows, []any{&n}, func() error {
			if n >= 1 && n <= int64(len(idx)) {
				renewed[n-1] = true
			}
			return nil
		})
		return err
	})
	for j, i := range idx {
		switch {
		case err != nil:
			errs[i] = fmt.Errorf("sqldb: postgres: refresh %q: %w", ls[i].Key, err)
		case !renewed[j]:
			errs[i] = backend.ErrNotHeld
		}
	}
}
