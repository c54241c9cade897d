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
	// across statements. CASE evaluates its WHENs in order and each
	// before its THEN, so the lock comes first (pg_advisory_xact_lock
	// returns void, which is not null).
	//
	// $4 bounds the statement on the server (0: no bound; see
	// maxStatementTime): it writes only if it gets there within $4
	// microseconds of its transaction's start, which is when the
	// statement reached the server, whatever it waited for since (the
	// table's lock, taken when the statement is bound; the advisory
	// lock; a row lock). Past it the token is null: a new row fails its
	// NOT NULL constraint (SQLSTATE 23502 on token) and the statement
	// writes nothing; a conflicting row is neither taken over nor marked
	// (the WHERE below). So an abandoned acquire that the server runs
	// late, its connection long gone, takes no key.
	inTime := `($4::bigint = 0 OR clock_timestamp() < now() + $4::bigint * interval '1 microsecond')`
	p.sqlAcq = `INSERT INTO ` + q + ` AS l (lock_key, owner, token, expires_at)
VALUES ($1::text, $2::text,
  CASE WHEN pg_advisory_xact_lock(` + strconv.Itoa(int(id.class())) + `, hashtext($1::text)) IS NULL THEN NULL
    WHEN ` + inTime + `
    THEN nextval('` + strings.ReplaceAll(seq, "'", "''") + `') END,
  now() + $3::bigint * interval '1 microsecond')
ON CONFLICT (lock_key) DO UPDATE
SET owner      = CASE WHEN l.expires_at <= now() THEN EXCLUDED.owner ELSE l.owner END,
    token      = CASE WHEN l.expires_at <= now() THEN EXCLUDED.token ELSE l.token END,
    waited     = l.expires_at > now(),
    expires_at = CASE WHEN l.expires_at <= now() THEN EXCLUDED.expires_at ELSE l.expires_at END
WHERE (l.expires_at <= now() OR NOT l.waited) AND ` + inTime + `
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
// It returns when ctx ends, whatever the database does: a statement
// then in flight (the table locked by another session, say) is
// abandoned with a [backend.AbandonedError]. TryAcquire sends a cancel
// request for it, and its Cleanup waits for the statement's reply and
// deletes l.Value's row if the statement wrote it after all, or if no
// reply came (the connection is dropped a second past the statement's
// server-side bound). That bound is the time left until ctx's deadline,
// at most 5s: past it the statement writes nothing, so an abandoned
// attempt takes no key later, even if the server runs it after the
// connection is gone. A statement the bound stops while ctx lives fails
// with an error wrapping [context.DeadlineExceeded]. A row taken as ctx
// ended is deleted the same way, in Cleanup. The connection of an
// abandoned statement goes back to the pool once the server has
// acknowledged the cancel request, and is closed if it did not.
//
// A statement whose connection fails (its outcome unknown) returns the
// error as an AbandonedError too, whose Cleanup deletes l.Value's row;
// when ctx cannot end, TryAcquire deletes it itself before returning.
func (p *Postgres) TryAcquire(ctx context.Context, l *backend.Lease) (bool, time.Duration, error) {
	if err := p.ValidateKey(l.Key); err != nil {
		return false, 0, err
	}
	// Waiting for a connection sends nothing: ctx may end it, no trace.
	c, err := p.pool.Acquire(ctx)
	if err == nil {
		err = ctx.Err()
		if err != nil {
			c.Release()
		}
	}
	if err != nil {
		return false, 0, fmt.Errorf("sqldb: postgres: acquire %q: %w", l.Key, err)
	}
	if ctx.Done() == nil { // nothing can end the call: no flight, no bound
		r := p.acquireOn(ctx, c, l, 0)
		c.Release()
		return p.outcome(ctx, l, r, 0)
	}
	bound := statementBound(ctx)
	pc := c.Conn().PgConn() // before the flight: c is the flight's from now on
	f := newFlight[pgReply](bound)
	// Once abandoned, the cancel request's result: the connection goes
	// back to the pool only once the server acknowledged it (as pgx's
	// own CancelRequestContextWatcherHandler waits before reuse), so that
	// it cannot cancel a later statement on it.
	var cancelled chan error
	go func() {
		r := p.acquireOn(context.WithoutCancel(ctx), c, l, bound)
		f.finish(r, func(abandoned bool) {
			if !abandoned || <-cancelled == nil {
				c.Release()
				return
			}
			cctx, cancel := context.WithTimeout(context.Background(), replyGrace)
			_ = c.Hijack().Close(cctx)
			cancel()
		})
	}()
	if r, ok := f.wait(ctx, func() { cancelled = make(chan error, 1) }); ok {
		return p.outcome(ctx, l, r, bound)
	}
	// Abandoned: ask the server to cancel the statement, so that its reply
	// comes at once; drop the connection if none has come by replyBy.
	go func() {
		cctx, cancel := context.WithDeadline(context.Background(), f.replyBy())
		defer cancel()
		cancelled <- pc.CancelRequest(cctx)
		select {
		case <-f.done:
		case <-cctx.Done():
			_ = pc.Conn().SetDeadline(time.Now())
		}
	}()
	return false, 0, &backend.AbandonedError{
		Err: fmt.Errorf("sqldb: postgres: acquire %q: gave up with the statement in flight: %w", l.Key, ctx.Err()),
		Cleanup: func(ctx context.Context) error {
			r, err := f.await(ctx)
			if err != nil {
				return fmt.Errorf("sqldb: postgres: clean up %q: %w", l.Key, err)
			}
			if r.err == nil && !r.ours || r.err != nil && !pgAmbiguous(r.err) {
				return nil // it wrote nothing
			}
			return p.cleanup(ctx, l)
		},
	}
}

// pgReply is an acquire statement's reply.
type pgReply struct {
	ours        bool
	token, left int64
	err         error
}

// acquireOn runs the acquire statement on c, bounded on the server by
// bound (0: unbounded).
func (p *Postgres) acquireOn(ctx context.Context, c *pgxpool.Conn, l *backend.Lease, bound time.Duration) (r pgReply) {
	var b int64
	if bound > 0 {
		b = micros(bound)
	}
	r.err = c.QueryRow(ctx, p.sqlAcq, l.Key, l.Value, micros(l.TTL), b).Scan(&r.ours, &r.token, &r.left)
	return r
}

// outcome turns an acquire statement's reply into TryAcquire's result.
func (p *Postgres) outcome(ctx context.Context, l *backend.Lease, r pgReply, bound time.Duration) (bool, time.Duration, error) {
	switch {
	case r.err == nil && r.ours && ctx.Err() != nil:
		// The caller gave up before the reply came: the row goes again.
		return false, 0, &backend.AbandonedError{
			Err:     fmt.Errorf("sqldb: postgres: acquire %q: taken after the caller gave up: %w", l.Key, ctx.Err()),
			Cleanup: func(ctx context.Context) error { return p.cleanup(ctx, l) },
		}
	case r.err == nil && r.ours:
		l.Token = uint64(r.token)
		return true, 0, nil
	case r.err == nil:
		return false, max(0, time.Duration(r.left)*time.Microsecond), nil
	case errors.Is(r.err, pgx.ErrNoRows), pgContention(r.err):
		return false, 0, nil
	case pgLate(r.err):
		return false, 0, fmt.Errorf("sqldb: postgres: acquire %q: %w", l.Key, lateError(bound, r.err))
	case !pgAmbiguous(r.err):
		return false, 0, fmt.Errorf("sqldb: postgres: acquire %q: %w", l.Key, r.err)
	case ctx.Done() == nil:
		return false, 0, fmt.Errorf("sqldb: postgres: acquire %q: %w", l.Key, p.undo(ctx, l, r.err))
	}
	return false, 0, &backend.AbandonedError{
		Err:     fmt.Errorf("sqldb: postgres: acquire %q: outcome unknown: %w", l.Key, r.err),
		Cleanup: func(ctx context.Context) error { return p.cleanup(ctx, l) },
	}
}

// cleanup deletes l.Value's row of l.Key, live or expired, for an
// AbandonedError's Cleanup; nil when there was none.
func (p *Postgres) cleanup(ctx context.Context, l *backend.Lease) error {
	cctx, cancel := cleanupContext(ctx)
	defer cancel()
	if _, err := p.release(cctx, l); err != nil {
		return fmt.Errorf("sqldb: postgres: clean up %q: %w", l.Key, err)
	}
	return nil
}

// undo deletes l.Value's row of l.Key, live or expired, after an acquire
// whose outcome is unknown, and returns err joined with the delete's
// error.
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

// pgLate reports whether err is an acquire statement's guard refusing to
// write past its server-side bound: the null token's NOT NULL violation.
func pgLate(err error) bool {
	var pe *pgconn.PgError
	return errors.As(err, &pe) && pe.Code == "23502" && pe.ColumnName == "token"
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
