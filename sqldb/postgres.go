package sqldb

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/distlock/distlock/backend"
)

var (
	_ backend.Spinner            = (*Postgres)(nil)
	_ backend.Refresher          = (*Postgres)(nil)
	_ backend.Notifier           = (*Postgres)(nil)
	_ backend.KeyValidator       = (*Postgres)(nil)
	_ interface{ Close() error } = (*Postgres)(nil)
)

// Postgres is a lock table in PostgreSQL, reached through a pgx pool. Make
// one with [NewPostgres]. It is safe for concurrent use.
type Postgres struct {
	pool       *pgxpool.Pool
	table      string // as the user wrote it
	channel    string // the LISTEN/NOTIFY channel: "distlock_" + the table's oid
	ln         *listener
	sqlAcq     string
	sqlRelFast string
	sqlRel     string
	sqlRef     string
}

// NewPostgres returns a lock backend over pool, creating the lock table if
// it does not exist. The caller owns pool: [Postgres.Close] does not close
// it. Options: [WithTable].
//
// The table name is resolved once, here, by the pool's search_path, and
// everything after goes by what it resolved to: the statements name the
// table and its sequence schema-qualified, and the lock that orders token
// draws and the notification channel are keyed by the table's oid. So
// resources that spell one table differently ("t", "public.t", or "t"
// under different search_paths) share one token order and one wake-up
// channel. A table dropped and created again under the same name is a new
// table: resources made before must be made anew.
//
// It returns an error for a nil pool or a bad option (before any I/O), and
// the database's error, wrapped, when the table cannot be checked or
// created.
func NewPostgres(ctx context.Context, pool *pgxpool.Pool, opts ...Option) (*Postgres, error) {
	if pool == nil {
		return nil, errors.New("sqldb: NewPostgres: nil pool")
	}
	c, err := buildConfig(opts)
	if err != nil {
		return nil, err
	}
	p := &Postgres{pool: pool, table: c.tableName()}
	id, err := p.createTable(ctx, c.table)
	if err != nil {
		return nil, err
	}
	q := pgx.Identifier{id.schema, id.name}.Sanitize()
	seq := pgx.Identifier{id.schema, id.name + "_token_seq"}.Sanitize()
	p.channel = "distlock_" + strconv.FormatUint(uint64(id.oid), 10)
	// One statement: insert our row, or take over a row whose lease ran
	// out by the server's clock. When a live owner holds the key, the
	// first contender marks the row waited (so the release will notify)
	// and learns the holder's remaining time; later contenders change
	// nothing and get no row. SET expressions read the old row; RETURNING
	// reads the new one, and owner values are unique per acquisition, so
	// owner = $2 means we hold it.
	//
	// The token is drawn under a transaction-scoped advisory lock on the
	// key, held until the statement commits, so acquires of one key draw
	// their tokens in the order they commit. Without it an acquire could
	// draw a number, stall, and insert it after a later number's holder
	// came and went: a smaller token for a later holder. The lock sits in
	// its own key space (the two-int4 form, the first int4 the table's
	// oid, the same however the table was named) and is never held
	// across statements. CASE evaluates WHEN before THEN, so the lock
	// comes first (pg_advisory_xact_lock returns void, which is not null).
	p.sqlAcq = `INSERT INTO ` + q + ` AS l (lock_key, owner, token, expires_at)
VALUES ($1::text, $2::text,
  CASE WHEN pg_advisory_xact_lock(` + strconv.Itoa(int(id.class())) + `, hashtext($1::text)) IS NOT NULL
    THEN nextval('` + strings.ReplaceAll(seq, "'", "''") + `') END,
  now() + $3::bigint * interval '1 microsecond')
ON CONFLICT (lock_key) DO UPDATE
SET owner      = CASE WHEN l.expires_at <= now() THEN EXCLUDED.owner ELSE l.owner END,
    token      = CASE WHEN l.expires_at <= now() THEN EXCLUDED.token ELSE l.token END,
    waited     = l.expires_at > now(),
    expires_at = CASE WHEN l.expires_at <= now() THEN EXCLUDED.expires_at ELSE l.expires_at END
WHERE l.expires_at <= now() OR NOT l.waited
RETURNING l.owner = $2::text, l.token, (date_part('epoch', l.expires_at - now()) * 1000000)::bigint`
	// The common release: our row, live, and no contender marked it
	// waited. It returns no row and calls no function, which costs the
	// server and the client markedly less than sqlRel (about 6% of an
	// uncontended cycle, pinned): when it deletes nothing, sqlRel
	// follows.
	p.sqlRelFast = `DELETE FROM ` + q + ` WHERE lock_key = $1 AND owner = $2 AND expires_at > now() AND NOT waited`
	// One statement: delete our row, live or expired (no stale rows left
	// behind), tell whether it was still live, and, if a contender marked
	// it waited, wake waiters when the transaction commits. An
	// uncontended release pays no notification. RETURNING reads the
	// deleted row.
	p.sqlRel = `DELETE FROM ` + q + ` WHERE lock_key = $1 AND owner = $2
RETURNING expires_at > now(), CASE WHEN waited THEN pg_notify($3, lock_key)::text END`
	p.sqlRef = `UPDATE ` + q + `
SET expires_at = now() + $3::bigint * interval '1 microsecond'
WHERE lock_key = $1 AND owner = $2 AND expires_at > now()`
	p.ln = newListener(pool, p.channel)
	return p, nil
}

// tableID is what a table name resolved to.
type tableID struct {
	oid          uint32
	schema, name string
}

// class is the first int4 of the table's advisory lock keys: its oid, bit
// for bit.
func (id tableID) class() int32 { return int32(id.oid) }

// createTable resolves the table named by parts (as written: one or two
// parts) by the pool's search_path, creating it and its sequence first if
// it does not exist.
func (p *Postgres) createTable(ctx context.Context, parts []string) (tableID, error) {
	q := pgx.Identifier(parts).Sanitize()
	resolve := func() (id tableID, ok bool, err error) {
		err = p.pool.QueryRow(ctx, `SELECT c.oid, n.nspname, c.relname
FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
WHERE c.oid = to_regclass($1)`, q).Scan(&id.oid, &id.schema, &id.name)
		if errors.Is(err, pgx.ErrNoRows) {
			return id, false, nil
		}
		return id, err == nil, err
	}
	id, ok, err := resolve()
	if err != nil {
		return id, fmt.Errorf("sqldb: postgres: check table %s: %w", p.table, err)
	}
	if ok {
		return id, nil // an existing table needs no CREATE privilege
	}
	seqParts := append([]string(nil), parts...)
	seqParts[len(seqParts)-1] += "_token_seq"
	seq := pgx.Identifier(seqParts).Sanitize()
	_, err = p.pool.Exec(ctx, `CREATE SEQUENCE IF NOT EXISTS `+seq+`;
CREATE TABLE IF NOT EXISTS `+q+` (
  lock_key   varchar(255) COLLATE "C" PRIMARY KEY,
  owner      text NOT NULL,
  token      bigint NOT NULL,
  expires_at timestamptz NOT NULL,
  waited     boolean NOT NULL DEFAULT false
);
ALTER SEQUENCE `+seq+` OWNED BY `+q+`.token`)
	// Two processes creating the table at once: the loser may see a
	// unique violation in the catalog although the table now exists.
	id, ok, err2 := resolve()
	switch {
	case err2 == nil && ok:
		return id, nil
	case err == nil && err2 != nil:
		err = err2
	case err == nil:
		err = errors.New("not found after CREATE TABLE")
	}
	return id, fmt.Errorf("sqldb: postgres: create table %s: %w", p.table, err)
}

// Table returns the lock table's name as given to [WithTable] (or
// [DefaultTable]).
func (p *Postgres) Table() string { return p.table }

// ValidateKey reports whether key fits the lock_key column: non-empty,
// valid UTF-8 without NUL, at most [MaxKeyLen] characters. It does no I/O.
func (p *Postgres) ValidateKey(key string) error { return validateKey(key, unitChars) }

// TryAcquire makes one attempt to take l.Key for l.TTL by the database's
// clock, in one statement. On success it sets l.Token from the table's
// sequence. It returns acquired == false with a nil error when a
// live owner holds the key, and also when the database reports a
// serialization failure, a deadlock or a lock timeout (SQLSTATE 40001,
// 40P01, 55P03): those are contention, so the facade's spin loop retries.
// The first contender for a holder's lease gets the holder's remaining
// time as holderTTL (and marks the row so that its release notifies);
// later ones get 0.
//
// The statement is not abandoned when ctx ends: it runs on until its reply
// comes (at most 5s more), and if it took the key after all, TryAcquire
// deletes the row again and returns ctx's error. When the outcome stays
// unknown (the connection failed, or no reply came within those 5s) it
// deletes l.Value's row, if any, over another connection before returning
// the error; that delete may come too early for a statement the server
// has yet to finish.
func (p *Postgres) TryAcquire(ctx context.Context, l *backend.Lease) (bool, time.Duration, error) {
	if err := p.ValidateKey(l.Key); err != nil {
		return false, 0, err
	}
	// Waiting for a connection sends nothing: ctx may end it, no trace.
	c, err := p.pool.Acquire(ctx)
	if err != nil {
		return false, 0, fmt.Errorf("sqldb: postgres: acquire %q: %w", l.Key, err)
	}
	var (
		ours        bool
		token, left int64
	)
	sctx, stop := statementContext(ctx)
	err = c.QueryRow(sctx, p.sqlAcq, l.Key, l.Value, micros(l.TTL)).Scan(&ours, &token, &left)
	stop()
	c.Release() // before any clean-up: the pool may have this one connection only
	switch {
	case err == nil && ours && ctx.Err() != nil:
		// The caller gave up before the reply came: undo, in order
		// after the statement, which has committed.
		return false, 0, fmt.Errorf("sqldb: postgres: acquire %q: %w", l.Key, p.undo(ctx, l, ctx.Err()))
	case err == nil && ours:
		l.Token = uint64(token)
		return true, 0, nil
	case err == nil:
		return false, max(0, time.Duration(left)*time.Microsecond), nil
	case errors.Is(err, pgx.ErrNoRows):
		return false, 0, nil
	case pgContention(err):
		return false, 0, nil
	}
	if pgAmbiguous(err) {
		err = p.undo(ctx, l, err)
	}
	return false, 0, fmt.Errorf("sqldb: postgres: acquire %q: %w", l.Key, err)
}

// undo deletes l.Value's row of l.Key, live or expired, after a failed or
// abandoned acquire, and returns err joined with the delete's error.
func (p *Postgres) undo(ctx context.Context, l *backend.Lease, err error) error {
	cctx, cancel := cleanupContext(ctx)
	defer cancel()
	if _, cerr := p.release(cctx, l); cerr != nil {
		err = errors.Join(err, fmt.Errorf("cleanup: %w", cerr))
	}
	return err
}

// Release deletes l's row if l.Value still owns l.Key: in one statement
// when the lock is live and no contender tried to acquire it meanwhile;
// otherwise a second statement deletes the row, live or expired, and
// notifies the waiters (pg_notify on the table's channel, payload the key)
// if a contender tried. It returns
// [backend.ErrNotHeld] when another owner holds the key, no row exists, or
// our row had expired (the stale row is deleted all the same). A
// serialization failure or deadlock reruns the statement, up to 5 times.
func (p *Postgres) Release(ctx context.Context, l *backend.Lease) error {
	if err := p.ValidateKey(l.Key); err != nil {
		return err
	}
	live, err := p.release(ctx, l)
	if err != nil {
		return fmt.Errorf("sqldb: postgres: release %q: %w", l.Key, err)
	}
	if !live {
		return backend.ErrNotHeld
	}
	return nil
}

func (p *Postgres) release(ctx context.Context, l *backend.Lease) (live bool, err error) {
	err = retryConflicts(pgContention, func() error {
		tag, err := p.pool.Exec(ctx, p.sqlRelFast, l.Key, l.Value)
		if err != nil || tag.RowsAffected() == 1 {
			live = err == nil
			return err
		}
		// Waited for, expired, or not ours: the full statement, which
		// notifies the waiters or deletes our stale row.
		err = p.pool.QueryRow(ctx, p.sqlRel, l.Key, l.Value, p.channel).Scan(&live, nil)
		if errors.Is(err, pgx.ErrNoRows) {
			live, err = false, nil
		}
		return err
	})
	return live, err
}

// Refresh extends l by l.TTL from the database's current time if l.Value
// still owns l.Key and has not expired. It returns [backend.ErrNotHeld]
// otherwise. A serialization failure or deadlock reruns the statement, up
// to 5 times.
func (p *Postgres) Refresh(ctx context.Context, l *backend.Lease) error {
	if err := p.ValidateKey(l.Key); err != nil {
		return err
	}
	var tag pgconn.CommandTag
	err := retryConflicts(pgContention, func() (err error) {
		tag, err = p.pool.Exec(ctx, p.sqlRef, l.Key, l.Value, micros(l.TTL))
		return err
	})
	if err != nil {
		return fmt.Errorf("sqldb: postgres: refresh %q: %w", l.Key, err)
	}
	if tag.RowsAffected() == 0 {
		return backend.ErrNotHeld
	}
	return nil
}

// Subscribe asks for release notices of key. The first subscription takes
// one connection from the pool for good (the pool's hooks, BeforeConnect
// and AfterConnect among them, ran for it as for any other; once taken it
// no longer counts against MaxConns) and LISTENs on the table's channel
// with it; it is closed again shortly after the last subscription is
// cancelled. Notices are hints; the spin
// loop stays the fallback. ch is nil after [Postgres.Close].
func (p *Postgres) Subscribe(key string) (ch <-chan struct{}, cancel func()) {
	return p.ln.subscribe(key)
}

// Close stops the LISTEN connection and its goroutine, if any, and waits
// for them. It does not close the pool. Subscribe returns a nil channel
// afterwards; the other methods keep working.
func (p *Postgres) Close() error {
	p.ln.close()
	return nil
}

// pgContention reports whether err is a transient conflict that the spin
// loop should retry: serialization failure, deadlock, lock timeout.
func pgContention(err error) bool {
	var pe *pgconn.PgError
	if !errors.As(err, &pe) {
		return false
	}
	switch pe.Code {
	case "40001", "40P01", "55P03":
		return true
	}
	return false
}

// pgAmbiguous reports whether a statement that failed with err may have
// committed: the server did not answer with an error and the request may
// have been sent. The statement ran on a connection already taken from
// the pool, so a context error is one that interrupted it, possibly after
// it was sent: pgx returns a bare context.Canceled for a cancellation
// mid-request (and flags a context that had ended before anything was
// sent as safe to retry).
func pgAmbiguous(err error) bool {
	var (
		pe *pgconn.PgError
		ce *pgconn.ConnectError
	)
	switch {
	case errors.As(err, &pe):
		return false // the server rejected it; autocommit rolled it back
	case errors.As(err, &ce), pgconn.SafeToRetry(err):
		return false // never connected, or pgx knows nothing was sent
	}
	return true
}
