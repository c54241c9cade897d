package sqldb

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
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
	_ backend.HeadNotifier       = (*Postgres)(nil)
	_ backend.Queuer             = (*Postgres)(nil)
	_ backend.MinQueueWaiter     = (*Postgres)(nil)
	_ backend.Withdrawer         = (*Postgres)(nil)
	_ backend.KeyValidator       = (*Postgres)(nil)
	_ interface{ Close() error } = (*Postgres)(nil)
)

// Postgres is a lock table in PostgreSQL, reached through a pgx pool. Make
// one with [NewPostgres]. It is safe for concurrent use.
type Postgres struct {
	pool    *pgxpool.Pool
	table   string // as the user wrote it
	channel string // the LISTEN/NOTIFY channel: "distlock_" + the table's oid
	ln      *listener
	// main is the mutex statements on the main table (keys that are
	// text), odd those on the kinds table (keys with a NUL byte or
	// invalid UTF-8).
	main, odd pgMutexSQL
	// Semaphores and read/write locks, on the kinds table.
	kAcq, kRel, kWithdraw, kGone, kRef, kInspect string
	// tracer is the pool's: the statements sent through pgconn call it
	// (see pgdirect.go).
	tracer pgx.QueryTracer
	gate   connGate // how acquire attempts get their connections
	// settling counts the clean-ups asking the server whether their
	// abandoned statement has settled (see settled).
	settling atomic.Int32
}

// pgMutexSQL is the statements of mutexes in one table.
type pgMutexSQL struct {
	acq, acqAlone, relFast, relAlone, rel, withdraw, gone, ref, refAll, inspect, relabel string
	// the names acq, acqAlone and relFast are prepared under (see pgdirect.go)
	acqName, acqAloneName, relFastName string
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
// Its I/O is bounded by ctx, or by [DefaultSetupTimeout] when ctx has no
// deadline. It returns an error wrapping backend.ErrInvalid
// (distlock.ErrInvalid) for a nil ctx or pool or a bad option, before any
// I/O, and the database's error, wrapped, when the table cannot be
// checked or created.
func NewPostgres(ctx context.Context, pool *pgxpool.Pool, opts ...Option) (*Postgres, error) {
	switch {
	case ctx == nil:
		return nil, fmt.Errorf("sqldb: NewPostgres: %w: nil context", backend.ErrInvalid)
	case pool == nil:
		return nil, fmt.Errorf("sqldb: NewPostgres: %w: nil pool", backend.ErrInvalid)
	}
	c, err := buildConfig("NewPostgres", opts)
	if err != nil {
		return nil, err
	}
	p := &Postgres{pool: pool, table: c.tableName()}
	sctx, cancel := setupContext(ctx)
	defer cancel()
	id, kid, err := p.createTable(sctx, c.table)
	if err != nil {
		return nil, setupError(sctx, err)
	}
	q := pgx.Identifier{id.schema, id.name}.Sanitize()
	kq := pgx.Identifier{kid.schema, kid.name}.Sanitize()
	seq := pgx.Identifier{id.schema, id.name + "_token_seq"}.Sanitize()
	p.channel = "distlock_" + strconv.FormatUint(uint64(id.oid), 10)
	p.main = pgMutexStmts(q, seq, id.class(), false)
	p.odd = pgMutexStmts(kq, seq, kid.class(), true)
	p.kindStmts(kq, seq, kid.class())
	p.ln = newListener(pool, p.channel)
	p.tracer = pool.Config().ConnConfig.Tracer
	return p, nil
}

// nowMicros is the statement's time, now(), in microseconds since 1970:
// the clock of the times in a group's state.
const nowMicros = `(extract(epoch FROM now()) * 1000000)::bigint`

// maxPayload bounds a NOTIFY's payload (PostgreSQL refuses 8000 bytes and
// more): a head whose owner value is longer is not woken, and finds the
// lock free on its next attempt.
const maxPayload = 8000

// inTime is an acquire statement's server-side bound: $4 microseconds
// from the start of its transaction (0: none).
const inTime = `($4::bigint = 0 OR clock_timestamp() < now() + $4::bigint * interval '1 microsecond')`

// pgMutexStmts returns the mutex statements of table q: the main table,
// keyed by text, or (odd) the kinds table, keyed by bytes, in rows of
// kind 0. Parameters: $1 key, $2 owner, $3 TTL in microseconds, $4 the
// acquire's server-side bound in microseconds, $5 the label, $6 whether
// the acquisition waits (backend.Lease.Waits: only then does a refused
// attempt queue), $7 the life of the intent it records (see intentLife);
// a release or withdrawal notifies the head on the queue
// channel $3, and a release with nobody queued the key's waiters on
// channel $4 with payload $5.
//
// A mutex's waiters queue in its row (column queue in the main table,
// state in the kinds table): a JSON array of intents, {"o": owner, "s":
// arrival number, "e": expiry in microseconds since 1970 by the
// database's clock}. The row lives while the lock is held or waited for.
//
// Column gone holds the markers of waiters that left while an attempt of
// theirs may still be on its way to the server (see [Postgres.Withdraw]):
// a JSON object, owner value to expiry in microseconds. While an owner
// value's marker lives, the acquire statements neither take the lock for
// it nor queue it, and the row is not deleted (the marker would go with
// it); the waiter's clean-up, once its attempt has settled, removes the
// marker (and the row, when nothing else is left in it).
func pgMutexStmts(q, seq string, class int32, odd bool) pgMutexSQL {
	cols, vals, conflict, where, hash := `lock_key`, `$1::text`, `(lock_key)`, `lock_key = $1::text`, `hashtext($1::text)`
	if odd {
		cols, vals, conflict, where = `lock_key, kind`, `$1::bytea, 0`, `(lock_key, kind)`, `lock_key = $1::bytea AND kind = 0`
		hash = `hashtext('0:' || encode($1::bytea, 'hex'))`
	}
	qcol := `queue` // the column of the waiters' intents
	if odd {
		qcol = `state`
	}
	var m pgMutexSQL
	// notGone: the row holds no live marker of $2; noMark: no live
	// marker of anybody.
	notGone := `(l.gone IS NULL OR coalesce((l.gone->>$2::text)::bigint, 0) <= ` + nowMicros + `)`
	noMark := `(l.gone IS NULL OR NOT EXISTS (SELECT FROM jsonb_each_text(l.gone) g WHERE g.value::bigint > ` + nowMicros + `))`
	// insert begins acq and acqAlone: our row, with a token drawn under
	// the key's advisory lock while the attempt is in time, or, on
	// conflict, the update that follows it.
	insert := `INSERT INTO ` + q + ` AS l (` + cols + `, owner, token, expires_at, label)
VALUES (` + vals + `, $2::text,
  CASE WHEN pg_advisory_xact_lock(` + strconv.Itoa(int(class)) + `, ` + hash + `) IS NULL THEN NULL
    WHEN ` + inTime + `
    THEN nextval('` + strings.ReplaceAll(seq, "'", "''") + `') END,
  now() + $3::bigint * interval '1 microsecond', $5::bytea)
ON CONFLICT ` + conflict + ` DO UPDATE
`
	// One statement: insert our row, or take over a row whose lease ran
	// out by the server's clock (a released row that waiters kept is one:
	// owner '' and expired), if no live intent of a waiter precedes ours
	// (or, without an intent of ours, if none waits). Otherwise it records
	// our intent in the row's queue, numbered by the token drawn for the
	// attempt (arrival order), or renews it for $7 from now, keeping its
	// number, and marks the row waited (so that its release takes the
	// statement that wakes the head). Expired intents go. SET expressions
	// read the old row; RETURNING reads the new one, and owner values are
	// unique per acquisition, so owner = $2 means we hold it: then the
	// third column is -1, and the first tells whether others still wait
	// (the release then goes straight to rel). Otherwise it returns the
	// time until the first event that may let us in unwoken: the holder's
	// expiry, or the lapse of every intent that precedes ours (the last of
	// them to lapse: while one of them lives, its release or withdrawal
	// will wake us; waking at each lapse ahead made every waiter try
	// again at each one). The statement returns the holder's time, the
	// queue and the server's clock, and the client works the lapse out
	// (queueLapse): subqueries in RETURNING are set up on every run of
	// the statement, taken or not, and cost an uncontended acquire a
	// fifth of its execution (EXPLAIN ANALYZE: 85 us against 68 us
	// without them; acqAlone 51 us). That setup is why a waiting
	// acquisition's cycle, which takes acq, fell behind a short wait's
	// with 16 goroutines on their own keys (0.76x of it).
	//
	// The queue is read once, in one aggregate over its live intents
	// (the others' intents, our arrival number, the first other's): a
	// form that looked the intents up in scalar subqueries, which the
	// planner ran once per use, cost 155us of execution per attempt
	// against 28-35us for this one (EXPLAIN ANALYZE and
	// pg_stat_statements, one queued waiter).
	m.acq = insert + `SET (owner, token, label, expires_at, waited, ` + qcol + `) = (
  SELECT CASE WHEN s.ok THEN EXCLUDED.owner ELSE l.owner END,
    CASE WHEN s.ok THEN EXCLUDED.token ELSE l.token END,
    CASE WHEN s.ok THEN EXCLUDED.label ELSE l.label END,
    CASE WHEN s.ok THEN EXCLUDED.expires_at ELSE l.expires_at END,
    NOT s.ok OR s.io IS NOT NULL,
    CASE WHEN s.ok OR NOT $6::boolean THEN coalesce(s.io, '[]') ELSE coalesce(s.io, '[]') || jsonb_build_array(jsonb_build_object('o', $2::text,
      's', coalesce(s.own, EXCLUDED.token), 'e', ` + nowMicros + ` + $7::bigint)) END
  FROM (SELECT a.io, a.own, l.expires_at <= now() AND (a.first IS NULL OR coalesce(a.own < a.first, false)) AS ok
    FROM (SELECT jsonb_agg(x) FILTER (WHERE x->>'o' <> $2::text) AS io,
        min((x->>'s')::bigint) FILTER (WHERE x->>'o' = $2::text) AS own,
        min((x->>'s')::bigint) FILTER (WHERE x->>'o' <> $2::text) AS first
      FROM jsonb_array_elements(coalesce(l.` + qcol + `, '[]')) x WHERE (x->>'e')::bigint > ` + nowMicros + `) a) s)
WHERE (l.expires_at <= now() OR NOT l.waited OR $6::boolean) AND ` + inTime + ` AND ` + notGone + `
RETURNING l.owner = $2::text AND l.waited, l.token, CASE WHEN l.owner = $2::text THEN -1::bigint
    WHEN l.expires_at > now() THEN (date_part('epoch', l.expires_at - now()) * 1000000)::bigint END,
  CASE WHEN l.owner <> $2::text THEN l.` + qcol + ` END, ` + nowMicros

	// The acquire of an attempt that does not queue (a single attempt, a
	// wait shorter than lineMinWait, or too near its end): acq's rules
	// with no intent of its own: it takes a free row only when no live
	// intent waits in it (otherwise it changes nothing and gets no row),
	// in a statement as small as the bare upsert. When a live owner holds
	// the key, the first contender marks the row waited and learns the
	// holder's remaining time; later contenders change nothing and get no
	// row. Parameters $1-$5 as acq's; it returns acq's columns. (acq's
	// earlier form cost a fifth of the grants of 3 processes x 4
	// goroutines with 200ms waits, none queued: 417-533 of 600 against
	// 576-590 in the same sitting; this one 541-587 against 572-590.)
	m.acqAlone = insert + `SET owner      = CASE WHEN l.expires_at <= now() THEN EXCLUDED.owner ELSE l.owner END,
    token      = CASE WHEN l.expires_at <= now() THEN EXCLUDED.token ELSE l.token END,
    label      = CASE WHEN l.expires_at <= now() THEN EXCLUDED.label ELSE l.label END,
    waited     = l.expires_at > now(),
    expires_at = CASE WHEN l.expires_at <= now() THEN EXCLUDED.expires_at ELSE l.expires_at END,
    ` + qcol + ` = CASE WHEN l.expires_at <= now() THEN NULL ELSE l.` + qcol + ` END
WHERE (l.expires_at <= now() OR NOT l.waited) AND ` + inTime + ` AND ` + notGone + `
  AND (l.` + qcol + ` IS NULL OR l.` + qcol + ` = '[]'::jsonb
    OR NOT EXISTS (SELECT FROM jsonb_array_elements(l.` + qcol + `) x WHERE (x->>'e')::bigint > ` + nowMicros + `))
RETURNING false, l.token, CASE WHEN l.owner = $2::text THEN -1::bigint
  ELSE greatest((date_part('epoch', l.expires_at - now()) * 1000000)::bigint, 0) END`
	// The common release: our row, live, and no contender marked it
	// waited. It returns no row and calls no function, which costs the
	// server and the client markedly less than rel (about 6% of an
	// uncontended cycle, pinned): when it deletes nothing, rel follows.
	m.relFast = `DELETE FROM ` + q + ` WHERE ` + where + ` AND owner = $2 AND expires_at > now() AND NOT waited`
	// Our row, live or expired, that no waiter queued in (nor left a
	// marker in, which keeps the row): deleted, and if a contender marked
	// it, the key's waiters woken (payload $4, the key, on channel $3).
	// The release of a lock taken by an acquisition that did not wait in
	// line, in a statement as small as the bare delete (with 1ms holds
	// and 200ms waits, none queued, 3 processes x 4 goroutines: rel in
	// its place granted 518-525 of 600 against main's 565-589, this one
	// 573-588 against 488-585); when it deletes nothing, rel follows.
	m.relAlone = `DELETE FROM ` + q + ` AS l WHERE ` + where + ` AND owner = $2 AND (l.` + qcol + ` IS NULL OR l.` + qcol + ` = '[]'::jsonb) AND l.gone IS NULL
RETURNING expires_at > now(), CASE WHEN waited THEN pg_notify($3, $4) END::text, false`
	// One statement: delete our row, live or expired, when no live
	// intent waits in it and no live marker keeps it (no stale rows left
	// behind; and if a contender marked it, wake the key's waiters: a
	// notice to nobody in particular); otherwise free it (no owner,
	// expired for ever: '-infinity', before any statement's now()) and
	// wake the head, the live intent that arrived first (payload: its
	// owner value, on the queue channel $3). It tells whether our lease
	// was still live, the notice, and whether it freed a row left with no
	// live intent after all (one that lapsed or left after the
	// statement's snapshot: see groupRemove), which gone then deletes.
	// The queue is left as it is: the acquire statements drop lapsed
	// intents.
	//
	// Whether our lease was live is read from the latest version of the
	// row, the one the DELETE or the UPDATE acts on (a refresh may have
	// committed a longer life after the statement's snapshot): DELETE
	// returns it; the UPDATE, whose RETURNING sees only the new row, keeps
	// it in waited, which the acquire statements never read in a freed
	// row (it has expired) and set anew when they take it. (A CTE that
	// locked the row first to read it cost a fifth more.)
	head := func(a string) string {
		return `(SELECT x->>'o' FROM jsonb_array_elements(` + a + `) x WHERE (x->>'e')::bigint > ` + nowMicros + ` ORDER BY (x->>'s')::bigint LIMIT 1)`
	}
	noLive := `NOT EXISTS (SELECT FROM jsonb_array_elements(l.` + qcol + `) x WHERE (x->>'e')::bigint > ` + nowMicros + `)`
	m.rel = `WITH d AS (
  DELETE FROM ` + q + ` AS l WHERE ` + where + ` AND l.owner = $2 AND ` + noLive + ` AND ` + noMark + `
  RETURNING l.expires_at > now() AS live, NULL::text AS head, l.waited
), u AS (
  UPDATE ` + q + ` AS l SET owner = '', label = '', expires_at = '-infinity', waited = l.expires_at > now()
  WHERE ` + where + ` AND l.owner = $2 AND NOT EXISTS (SELECT FROM d)
  RETURNING l.waited, ` + head(`l.`+qcol) + ` AS head, false
)
SELECT r.live, CASE WHEN octet_length(r.head) < ` + strconv.Itoa(maxPayload) + ` THEN pg_notify($3, r.head)
    WHEN r.waited THEN pg_notify($4, $5) END::text, r.u AND r.head IS NULL
FROM (SELECT *, false AS u FROM d UNION ALL SELECT *, true FROM u) r`
	// A waiter's withdrawal: our intent goes (with the row, when it is
	// free or expired and no other live intent or marker is left in it);
	// when the lock is free, the new head is woken. With $4 > 0 it leaves
	// our marker for $4 microseconds instead of deleting the row (an
	// attempt of ours may be in flight); with $4 = 0 it removes our
	// marker too (the clean-up, once that attempt has settled).
	otherMarks := `coalesce((SELECT jsonb_object_agg(g.key, g.value) FROM jsonb_each(l.gone) g
      WHERE g.key <> $2::text AND g.value::bigint > ` + nowMicros + `), '{}')`
	m.withdraw = `WITH d AS (
  DELETE FROM ` + q + ` AS l WHERE ` + where + ` AND l.expires_at <= now() AND $4::bigint = 0
    AND (EXISTS (SELECT FROM jsonb_array_elements(l.` + qcol + `) x WHERE x->>'o' = $2::text) OR l.gone->$2::text IS NOT NULL)
    AND NOT EXISTS (SELECT FROM jsonb_array_elements(l.` + qcol + `) x WHERE (x->>'e')::bigint > ` + nowMicros + ` AND x->>'o' <> $2::text)
    AND ` + otherMarks + ` = '{}'
  RETURNING NULL::text AS head, false AS empty
), u AS (
  UPDATE ` + q + ` AS l SET (` + qcol + `, waited, gone) = (SELECT n.q, l.expires_at <= now() OR n.q <> '[]'::jsonb OR $4::bigint > 0 OR n.g <> '{}',
      CASE WHEN $4::bigint > 0 THEN n.g || jsonb_build_object($2::text, ` + nowMicros + ` + $4::bigint) ELSE nullif(n.g, '{}') END
    FROM (SELECT coalesce((SELECT jsonb_agg(x) FROM jsonb_array_elements(l.` + qcol + `) x
      WHERE (x->>'e')::bigint > ` + nowMicros + ` AND x->>'o' <> $2::text), '[]') AS q, ` + otherMarks + ` AS g) n)
  WHERE ` + where + ` AND NOT EXISTS (SELECT FROM d)
    AND ($4::bigint > 0 OR l.gone->$2::text IS NOT NULL
      OR EXISTS (SELECT FROM jsonb_array_elements(l.` + qcol + `) x WHERE x->>'o' = $2::text))
  RETURNING CASE WHEN l.expires_at <= now() THEN ` + head(`l.`+qcol) + ` END AS head,
    l.expires_at <= now() AND l.` + qcol + ` = '[]'::jsonb AND l.gone IS NULL AS empty
)
SELECT CASE WHEN octet_length(r.head) < ` + strconv.Itoa(maxPayload) + ` THEN pg_notify($3, r.head) END::text, r.empty
FROM (SELECT * FROM d UNION ALL SELECT * FROM u) r`
	// A free or expired row with no live intent: deleted after a release
	// or withdrawal that left it so.
	m.gone = `DELETE FROM ` + q + ` AS l WHERE ` + where + ` AND l.expires_at <= now() AND ` + noLive + ` AND ` + noMark
	m.ref = `UPDATE ` + q + `
SET expires_at = now() + $3::bigint * interval '1 microsecond'
WHERE ` + where + ` AND owner = $2 AND expires_at > now()`
	// A batch of renewals: the leases' keys, owners and TTLs as arrays,
	// numbered; the numbers of the leases renewed come back.
	keys := `$1::text[]`
	if odd {
		keys = `$1::bytea[]`
	}
	kindCond := ``
	if odd {
		kindCond = ` AND l.kind = 0`
	}
	m.refAll = `UPDATE ` + q + ` AS l
SET expires_at = now() + u.ttl * interval '1 microsecond'
FROM unnest(` + keys + `, $2::text[], $3::bigint[]) WITH ORDINALITY AS u(k, o, ttl, i)
WHERE l.lock_key = u.k` + kindCond + ` AND l.owner = u.o AND l.expires_at > now()
RETURNING u.i`
	m.inspect = `SELECT token, (date_part('epoch', expires_at - now()) * 1000000)::bigint, label FROM ` + q + `
WHERE ` + where + ` AND expires_at > now()`
	// An election's leader publishes a value: $3 the new label.
	m.relabel = `UPDATE ` + q + ` SET label = $3::bytea WHERE ` + where + ` AND owner = $2 AND expires_at > now()`
	m.acqName, m.acqAloneName, m.relFastName = stmtName(m.acq), stmtName(m.acqAlone), stmtName(m.relFast)
	return m
}

// kindStmts makes the statements of semaphores and read/write locks: one
// row per lock in the kinds table kq, whose state holds its holders and,
// for a read/write lock, the intents of its waiting requests (see
// groupState).
func (p *Postgres) kindStmts(kq, seq string, class int32) {
	// Parameters: $1 key, $2 owner, $3 TTL (µs), $4 bound (µs), $5 the
	// row's kind, $6 the grant's mode ("s", "r", "w"), $7 the limit (0
	// for a read/write lock), $8 the label, $9 the life of the intent a
	// refused attempt records or renews (µs; 0: it records none).
	//
	// One statement. The row is locked by the upsert (ON CONFLICT DO
	// UPDATE reads its latest version, whatever the statement's
	// snapshot), so attempts on one lock are serialized, each deciding on
	// the state the last one committed: never more than the limit. The
	// decision, on the live entries (expiry after now):
	//   s: fewer holders than $7, no holder took it with another limit,
	//      and fewer intents precede ours (all of them, with no intent of
	//      ours) than permits are free: the first k waiters in line can
	//      take k free permits, and nobody behind them can;
	//   r: no writer holds, and no writer's intent precedes ours (or, with
	//      no intent of ours, no writer's intent at all);
	//   w: nobody holds, and no intent precedes ours (or none at all).
	// A grant adds a holder with the token and drops our intent; an
	// attempt that cannot hold (but a semaphore's refused for another
	// limit) adds an intent, for $9 from now, numbered by the token
	// drawn (arrival order), or renews ours, keeping its number;
	// expired entries go. The token is drawn as a mutex's is, under the
	// advisory lock of (the kinds table's oid, the row's kind and key),
	// so grants draw in commit order even across the row's deletion and
	// re-creation. It returns our token (when we hold), the limit the
	// holders took it with (ours when nobody holds), and the time until
	// the first event that may let us in unwoken: the expiry of another
	// holder or the lapse of an intent ahead of ours.
	own := `(SELECT x FROM jsonb_array_elements(g.state->'i') x WHERE (x->>'e')::bigint > a.n AND x->>'o' = $2::text LIMIT 1)`
	precedes := `(b.own IS NULL OR (x->>'s')::bigint < (b.own->>'s')::bigint)`
	me := `jsonb_build_object('o', $2::text, 'k', $6::text, 't', %s, 'e', %s + $3::bigint, 'l', encode($8::bytea, 'hex'))`
	p.kAcq = `INSERT INTO ` + kq + ` AS g (lock_key, kind, token, expires_at, lim, state)
SELECT $1::bytea, $5::smallint, c.tok, now() + $3::bigint * interval '1 microsecond', $7::int,
  jsonb_build_object('h', jsonb_build_array(` + fmt.Sprintf(me, `c.tok`, `c.n`) + `), 'i', '[]'::jsonb)
FROM (SELECT CASE WHEN pg_advisory_xact_lock(` + strconv.Itoa(int(class)) + `, hashtext($5::smallint::text || ':' || encode($1::bytea, 'hex'))) IS NULL THEN NULL
    WHEN ` + inTime + ` THEN nextval('` + strings.ReplaceAll(seq, "'", "''") + `') END AS tok,
  ` + nowMicros + ` AS n) c
ON CONFLICT (lock_key, kind) DO UPDATE
SET (state, lim, token, expires_at, waited) = (
  SELECT jsonb_build_object('h', s.nh, 'i', s.ni),
    CASE WHEN s.ok OR s.nh = '[]'::jsonb THEN $7::int ELSE g.lim END,
    CASE WHEN s.ok THEN EXCLUDED.token ELSE g.token END,
    timestamptz 'epoch' + (SELECT max((x->>'e')::bigint) FROM jsonb_array_elements(s.nh || s.ni) x) * interval '1 microsecond',
    g.waited OR NOT s.ok
  FROM (SELECT d.ok,
      CASE WHEN d.ok THEN d.h || jsonb_build_array(` + fmt.Sprintf(me, `EXCLUDED.token`, `d.n`) + `) ELSE d.h END AS nh,
      CASE WHEN d.ok OR $9::bigint <= 0 OR $6::text = 's' AND jsonb_array_length(d.h) > 0 AND g.lim <> $7::int THEN d.io
        ELSE d.io || jsonb_build_array(jsonb_build_object('o', $2::text, 'k', $6::text,
          's', coalesce((d.own->>'s')::bigint, EXCLUDED.token), 'e', d.n + $9::bigint)) END AS ni
    FROM (SELECT b.*, CASE $6::text
        WHEN 's' THEN jsonb_array_length(b.h) < $7::int AND (jsonb_array_length(b.h) = 0 OR g.lim = $7::int)
          AND (b.io = '[]'::jsonb OR (SELECT count(*) FROM jsonb_array_elements(b.io) x WHERE ` + precedes + `) < $7::int - jsonb_array_length(b.h))
        WHEN 'r' THEN NOT EXISTS (SELECT FROM jsonb_array_elements(b.h) x WHERE x->>'k' = 'w')
          AND NOT EXISTS (SELECT FROM jsonb_array_elements(b.io) x WHERE x->>'k' = 'w' AND ` + precedes + `)
        ELSE jsonb_array_length(b.h) = 0
          AND NOT EXISTS (SELECT FROM jsonb_array_elements(b.io) x WHERE ` + precedes + `)
      END AS ok
      FROM (SELECT a.n,
          coalesce((SELECT jsonb_agg(x) FROM jsonb_array_elements(g.state->'h') x WHERE (x->>'e')::bigint > a.n), '[]') AS h,
          coalesce((SELECT jsonb_agg(x) FROM jsonb_array_elements(g.state->'i') x WHERE (x->>'e')::bigint > a.n AND x->>'o' <> $2::text), '[]') AS io,
          ` + own + ` AS own
        FROM (SELECT ` + nowMicros + ` AS n) a) b) d) s)
WHERE ` + inTime + `
RETURNING (SELECT (x->>'t')::bigint FROM jsonb_array_elements(g.state->'h') x WHERE x->>'o' = $2::text LIMIT 1),
  g.lim,
  (SELECT min((x->>'e')::bigint) FROM jsonb_array_elements((g.state->'h') || (g.state->'i')) x WHERE x->>'o' <> $2::text
    AND NOT coalesce((x->>'s')::bigint > (SELECT (y->>'s')::bigint FROM jsonb_array_elements(g.state->'i') y WHERE y->>'o' = $2::text LIMIT 1), false)) - ` + nowMicros
	p.kRel = groupRemove(kq, `h`, `x->>'o' = $2::text AND x->>'k' = $4::text`)
	p.kWithdraw = groupRemove(kq, `i`, `x->>'o' = $2::text AND x->>'k' = $4::text`)
	p.kGone = `DELETE FROM ` + kq + ` AS g WHERE g.lock_key = $1::bytea AND g.kind = $2::smallint
  AND NOT EXISTS (SELECT FROM jsonb_array_elements((g.state->'h') || (g.state->'i')) x WHERE (x->>'e')::bigint > ` + nowMicros + `)`
	p.kRef = `UPDATE ` + kq + ` AS g
SET state = jsonb_set(g.state, '{h}', (SELECT jsonb_agg(CASE WHEN x->>'o' = $2::text THEN jsonb_set(x, '{e}', to_jsonb(` + nowMicros + ` + $5::bigint)) ELSE x END)
    FROM jsonb_array_elements(g.state->'h') x)),
  expires_at = greatest(g.expires_at, now() + $5::bigint * interval '1 microsecond')
WHERE g.lock_key = $1::bytea AND g.kind = $3::smallint
  AND EXISTS (SELECT FROM jsonb_array_elements(g.state->'h') x WHERE x->>'o' = $2::text AND x->>'k' = $4::text AND (x->>'e')::bigint > ` + nowMicros + `)`
	p.kInspect = `SELECT state, lim, ` + nowMicros + ` FROM ` + kq + ` WHERE lock_key = $1::bytea AND kind = $2::smallint`
}

// groupRemove is the statement that removes our entry from a group's
// state (arr "h": our grant, a release; "i": our intent, a withdrawal),
// with expired entries, deleting the row when no live entry is left (no
// row stays behind), and notifies the waiters when a contender marked
// the row. Parameters: $1 key, $2 owner, $3 the row's kind, $4 the
// grant's mode, $5 the channel, $6 the payload, $7 the queue channel. It
// returns one row (whether our entry was live) when it was there, none
// otherwise.
//
// A semaphore's waiters in line are told their turn as a mutex's head
// is: when live intents are left, it notifies the first of them, as many
// as permits are free, each on the queue channel with its owner value as
// payload, and the key's waiters only when more permits are free than
// waiters wait in line (a newcomer may then take one). So a release
// wakes the waiter it lets in, not every waiter of the key (each of
// which tried again, only for the first in line to get in).
//
// Whether our entry was live is read by cur, which locks the row (FOR
// UPDATE) and so reads its latest version, the one the DELETE or the
// UPDATE then removes our entry from: no other statement can change the
// row in between. (A read of the row from the statement's snapshot would
// see our entry expired when a refresh that began before the expiry
// committed a longer life after the snapshot: the release would remove a
// live grant and say ErrNotHeld.)
//
// The DELETE and the UPDATE are exclusive: the UPDATE runs only where the
// DELETE deleted nothing. The DELETE rechecks its condition on the latest
// version of the row if a concurrent statement changed it (READ
// COMMITTED's rule for the rows a statement modifies), so the row is
// deleted only if no live entry but ours is in its latest version. But
// it judges first by the version in the statement's snapshot: when that
// one still had another live entry, which left meanwhile, the UPDATE
// (which does work on the latest version) leaves the row empty, and says
// so (the third column): kGone then deletes it.
//
// kGone is that DELETE of a row with no live entry, in a statement of
// its own (its snapshot sees what the first one committed; a row changed
// since is rechecked on its latest version).
func groupRemove(kq, arr, mine string) string {
	mineH, mineI := `false`, `false`
	if arr == "h" {
		mineH = mine
	} else {
		mineI = mine
	}
	keep := func(a, m string) string {
		return `coalesce((SELECT jsonb_agg(x) FROM jsonb_array_elements(g.state->'` + a + `') x
      WHERE (x->>'e')::bigint > ` + nowMicros + ` AND NOT (` + m + `)), '[]')`
	}
	return `WITH cur AS (
  SELECT (SELECT (x->>'e')::bigint > ` + nowMicros + ` FROM jsonb_array_elements(o.state->'` + arr + `') x WHERE ` + mine + ` LIMIT 1) AS live
  FROM ` + kq + ` AS o WHERE o.lock_key = $1::bytea AND o.kind = $3::smallint
  FOR UPDATE
), d AS (
  DELETE FROM ` + kq + ` AS g USING cur WHERE g.lock_key = $1::bytea AND g.kind = $3::smallint
    AND EXISTS (SELECT FROM jsonb_array_elements(g.state->'` + arr + `') x WHERE ` + mine + `)
    AND NOT EXISTS (SELECT FROM jsonb_array_elements(g.state->'h') x WHERE (x->>'e')::bigint > ` + nowMicros + ` AND NOT (` + mineH + `))
    AND NOT EXISTS (SELECT FROM jsonb_array_elements(g.state->'i') x WHERE (x->>'e')::bigint > ` + nowMicros + ` AND NOT (` + mineI + `))
  RETURNING g.waited, cur.live
), u AS (
  UPDATE ` + kq + ` AS g SET state = jsonb_build_object('h', ` + keep("h", mineH) + `, 'i', ` + keep("i", mineI) + `)
  FROM cur
  WHERE g.lock_key = $1::bytea AND g.kind = $3::smallint AND NOT EXISTS (SELECT FROM d)
    AND EXISTS (SELECT FROM jsonb_array_elements(g.state->'` + arr + `') x WHERE ` + mine + `)
  RETURNING g.waited, cur.live, g.state = '{"h": [], "i": []}'::jsonb AS empty,
    greatest(g.lim - jsonb_array_length(g.state->'h'), 0) AS free, g.state->'i' AS line
)
SELECT coalesce(r.live, false), CASE WHEN r.heads >= 0 AND r.waited AND r.general THEN pg_notify($5, $6) END::text, r.empty
FROM (SELECT d.waited, d.live, false AS empty, true AS general, 0::bigint AS heads FROM d
  UNION ALL SELECT u.waited, u.live, u.empty, $3::smallint <> ` + strconv.Itoa(rowSem) + ` OR jsonb_array_length(u.line) < u.free,
    CASE WHEN $3::smallint = ` + strconv.Itoa(rowSem) + ` THEN (SELECT count(pg_notify($7, h.o)::text)
      FROM (SELECT x->>'o' AS o FROM jsonb_array_elements(u.line) x ORDER BY (x->>'s')::bigint LIMIT u.free) h
      WHERE octet_length(h.o) < ` + strconv.Itoa(maxPayload) + `) ELSE 0 END
  FROM u) r`
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
// parts) by the pool's search_path, creating it, its sequence and its
// kinds table first if they do not exist. It returns the main table and
// the kinds table.
func (p *Postgres) createTable(ctx context.Context, parts []string) (main, kinds tableID, err error) {
	q := pgx.Identifier(parts).Sanitize()
	kparts := append([]string(nil), parts...)
	kparts[len(kparts)-1] += kindsSuffix
	kq := pgx.Identifier(kparts).Sanitize()
	resolve := func(q string) (id tableID, ok bool, err error) {
		err = p.pool.QueryRow(ctx, `SELECT c.oid, n.nspname, c.relname
FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
WHERE c.oid = to_regclass($1)`, q).Scan(&id.oid, &id.schema, &id.name)
		if errors.Is(err, pgx.ErrNoRows) {
			return id, false, nil
		}
		return id, err == nil, err
	}
	seqParts := append([]string(nil), parts...)
	seqParts[len(seqParts)-1] += "_token_seq"
	seq := pgx.Identifier(seqParts).Sanitize()
	create := `CREATE SEQUENCE IF NOT EXISTS ` + seq + `;
CREATE TABLE IF NOT EXISTS ` + q + ` (
  lock_key   varchar(255) COLLATE "C" PRIMARY KEY,
  owner      text NOT NULL,
  token      bigint NOT NULL,
  expires_at timestamptz NOT NULL,
  waited     boolean NOT NULL DEFAULT false,
  label      bytea NOT NULL DEFAULT '',
  queue      jsonb,
  gone       jsonb
);
ALTER SEQUENCE ` + seq + ` OWNED BY ` + q + `.token;
CREATE TABLE IF NOT EXISTS ` + kq + ` (
  lock_key   bytea NOT NULL,
  kind       smallint NOT NULL,
  owner      text NOT NULL DEFAULT '',
  token      bigint NOT NULL,
  expires_at timestamptz NOT NULL,
  waited     boolean NOT NULL DEFAULT false,
  label      bytea NOT NULL DEFAULT '',
  lim        integer NOT NULL DEFAULT 0,
  state      jsonb,
  gone       jsonb,
  PRIMARY KEY (lock_key, kind)
)`
	check := func() (main, kinds tableID, ready bool, err error) {
		main, ok, err := resolve(q)
		if err != nil || !ok {
			return main, kinds, false, err
		}
		kinds, ready, err = resolve(kq)
		return main, kinds, ready, err
	}
	main, kinds, ready, err := check()
	if err != nil {
		return main, kinds, fmt.Errorf("sqldb: postgres: check table %s: %w", p.table, err)
	}
	if ready {
		return main, kinds, nil // an existing table needs no CREATE privilege
	}
	_, err = p.pool.Exec(ctx, create)
	// Two processes creating the table at once: the loser may see a
	// unique violation in the catalog although the table now exists.
	main, kinds, ready, err2 := check()
	switch {
	case err2 == nil && ready:
		return main, kinds, nil
	case err == nil && err2 != nil:
		err = err2
	case err == nil:
		err = errors.New("not found after CREATE TABLE")
	}
	return main, kinds, fmt.Errorf("sqldb: postgres: create table %s: %w", p.table, err)
}

// Table returns the lock table's name as given to [WithTable] (or
// [DefaultTable]).
func (p *Postgres) Table() string { return p.table }

// ValidateKey reports whether key is a key the tables hold: non-empty and
// at most [MaxKeyLen] characters (a byte that is not valid UTF-8 counts as
// one). Any bytes are a key: a key with a NUL byte or invalid UTF-8 lives
// in the kinds table, whose keys are bytes. It does no I/O.
func (p *Postgres) ValidateKey(key string) error { return validateKey(key, unitChars) }

// CheckKind implements backend.KindChecker: PostgreSQL holds mutexes,
// semaphores and read/write locks.
func (p *Postgres) CheckKind(backend.Kind) error { return nil }

// mutex returns the statements of key's mutex: the main table's for a
// text key, the kinds table's for the others.
func (p *Postgres) mutex(key string) *pgMutexSQL {
	if textKey(key) {
		return &p.main
	}
	return &p.odd
}

// keyArg is key as the statements of its mutex take it.
func keyArg(key string) any {
	if textKey(key) {
		return key
	}
	return bytesArg(key)
}

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
// The statement runs on the caller's goroutine. It returns when ctx is
// cancelled, and at most lateReply (100 ms) after ctx's deadline,
// whatever the database does: ctx's end sets the connection's deadline
// (to now when cancelled, as pgx does; lateReply past the deadline
// otherwise, for a reply already on its way), and a statement then in
// flight (the table locked by another session, say) is abandoned with
// its connection, with a [backend.AbandonedError]. Its Cleanup asks the
// server to cancel the statement, waits until the server process that
// ran it is gone (it has then read the statement, if it ever arrived,
// and the connection's end), or at most a second past the statement's
// server-side bound, and then deletes l.Value's row if there is one.
// That bound is the time left until ctx's deadline, at most 5s: past it
// the statement writes nothing, so an abandoned attempt takes no key
// later, even if the server runs it after the connection is gone. A
// statement the bound stops while ctx lives fails with an error wrapping
// [context.DeadlineExceeded]. A row taken as ctx ended (its reply read)
// is deleted in Cleanup over the connection that took it.
//
// Waiting for a connection of the pool ends with ctx too. pgxpool goes
// on making a connection whose caller left, so once such a wait ran out,
// attempts start no more new connections than attempts wait for, until
// the pool answers promptly again.
//
// A statement whose connection fails (its outcome unknown) returns the
// error as an AbandonedError too, whose Cleanup deletes l.Value's row;
// when ctx cannot end, TryAcquire deletes it itself before returning.
func (p *Postgres) TryAcquire(ctx context.Context, l *backend.Lease) (bool, time.Duration, error) {
	if err := p.ValidateKey(l.Key); err != nil {
		return false, 0, err
	}
	// Waiting for a connection sends nothing: ctx may end it, no trace.
	c, err := p.gate.conn(ctx, p.pool)
	if err == nil {
		err = ctx.Err()
		if err != nil {
			c.Release()
		}
	}
	if err != nil {
		return false, 0, fmt.Errorf("sqldb: postgres: acquire %q: %w", l.Key, err)
	}
	if bc, ok := ctx.(backend.BoundedContext); ok && bc.Cancelled() == nil {
		return p.acquireUntilBound(bc, c, l)
	}
	if ctx.Done() == nil { // nothing can end the call: no bound
		call := pgCall{life: intentLife(ctx, l.TTL)}
		r := p.acquireOn(ctx, &call, c, l, 0)
		return p.finish(ctx, c, l, r, 0)
	}
	// The statement runs here, on the caller's goroutine, as pgx runs
	// one: it sees a context that cannot end (call: ctx's values only),
	// and ctx's end sets the connection's deadline to now (pgx's
	// DeadlineContextWatcherHandler, whatever the pool's own handler),
	// which ends the read at once. The registration is no goroutine:
	// ctx's Done was made to wait for the connection.
	bound := statementBound(ctx)
	pc := c.Conn().PgConn()
	call := &pgCall{parent: ctx, life: intentLife(ctx, l.TTL)}
	cut := make(chan struct{}) // closed once the deadline was set: the statement was cut off
	sent := time.Now()
	stop := context.AfterFunc(ctx, func() {
		// A cancel cuts the statement off at once; the deadline's
		// passing leaves its reply lateReply to come (see
		// acquireUntilBound).
		at := time.Now()
		if ctx.Err() == context.DeadlineExceeded {
			at = at.Add(lateReply)
		}
		_ = pc.Conn().SetDeadline(at)
		close(cut)
	})
	r := p.acquireOn(call, call, c, l, bound)
	if afterAttempt != nil {
		afterAttempt()
	}
	if stop() {
		return p.finish(ctx, c, l, r, bound)
	}
	<-cut
	if !pc.IsClosed() {
		// The reply came before the deadline took effect (a row, no
		// row, or the server's error): its outcome is known. The
		// connection's deadline goes, as pgx's HandleUnwatchAfterCancel
		// does, before it goes back to the pool.
		_ = pc.Conn().SetDeadline(time.Time{})
		return p.finish(ctx, c, l, r, bound)
	}
	// Cut off: pgconn closed the connection.
	c.Release()
	return false, 0, p.cutOff(ctx, l, r, pc, sent, bound)
}

// acquireUntilBound runs TryAcquire's statement on c for an acquisition
// whose caller cannot cancel it (backend.BoundedContext with no
// Cancelled): only its bound ends it, and the connection's deadline
// carries the bound and lateReply, so nothing watches ctx (its Done would
// cost a timer and callbacks per call). A Close of the DistributeLock is seen between
// attempts (ctx.Err). A statement the deadline cuts off, or whose
// connection fails, has an unknown outcome, as in TryAcquire's other
// paths: pgconn closed the connection, and the AbandonedError's Cleanup
// waits until the statement can no longer write before deleting the row.
func (p *Postgres) acquireUntilBound(ctx backend.BoundedContext, c *pgxpool.Conn, l *backend.Lease) (bool, time.Duration, error) {
	bound := statementBound(ctx)
	pc := c.Conn().PgConn()
	sent := time.Now()
	_ = pc.Conn().SetDeadline(sent.Add(bound + lateReply))
	call := pgCall{parent: ctx, life: intentLife(ctx, l.TTL)}
	r := p.acquireOn(&call, &call, c, l, bound)
	if !pc.IsClosed() {
		// A reply (a row, no row, or the server's error): the outcome is
		// known.
		_ = pc.Conn().SetDeadline(time.Time{})
		return p.finish(ctx, c, l, r, bound)
	}
	// Cut off by the deadline, or the connection failed: pgconn closed it.
	c.Release()
	return false, 0, p.cutOff(ctx, l, r, pc, sent, bound)
}

// cutOff is TryAcquire's error for a statement, sent at sent with bound,
// whose connection pc closed before its reply: the error itself when
// nothing was sent; otherwise an AbandonedError, as the statement may
// still be on its way: until it has settled a withdrawal leaves a marker,
// and its Cleanup waits for it to settle before deleting l.Value's row.
func (p *Postgres) cutOff(ctx context.Context, l *backend.Lease, r pgReply, pc *pgconn.PgConn, sent time.Time, bound time.Duration) error {
	if !pgAmbiguous(r.err) { // nothing was sent
		if ctx.Err() != nil {
			return fmt.Errorf("sqldb: postgres: acquire %q: %w: %w", l.Key, ctx.Err(), r.err)
		}
		return fmt.Errorf("sqldb: postgres: acquire %q: %w", l.Key, r.err)
	}
	err := fmt.Errorf("outcome unknown: %w", r.err)
	if ctx.Err() != nil {
		err = fmt.Errorf("gave up with the statement in flight: %w", ctx.Err())
	}
	f := new(pgFlight)
	l.Handle = f
	return &backend.AbandonedError{
		Err: fmt.Errorf("sqldb: postgres: acquire %q: %w", l.Key, err),
		Cleanup: func(ctx context.Context) error {
			if err := p.settled(ctx, pc, sent.Add(bound+replyGrace)); err != nil {
				return fmt.Errorf("sqldb: postgres: clean up %q: %w", l.Key, err)
			}
			f.settle()
			return p.cleanup(ctx, l)
		},
	}
}

// lateReply is how long past its context's deadline an acquire
// statement's reply is still waited for before the statement is cut off
// (its connection closed). The statement writes nothing once the deadline
// has passed on the server (its bound), so a reply that comes this late
// only tells a known outcome: taken in time, refused, or late. Cutting
// it off instead would make that outcome unknown, cost the connection
// (a new one for the next attempt: a fork on the server) and, for a
// statement that took the lock, keep the lock from everyone until the
// clean-up has made sure the statement can no longer write. Under load,
// with many processes contending for a key, replies landing just past
// short waits are common (the client's goroutine runs late): cut off,
// they fed a storm of new connections in which nobody got the lock
// (issue 36).
const lateReply = 100 * time.Millisecond

// afterAttempt, when not nil, runs between an attempt's reply and the
// check for its context's end (tests: a context that ends just then).
var afterAttempt func()

// settled returns once the statement abandoned on pc can no longer write:
// the server process that ran it is gone (it had read the whole closed
// connection, the statement included, by then), or by is past (the
// statement's server-side bound and replyGrace: a statement that reaches
// the server that late is assumed lost). The server was asked to cancel
// the statement when pc closed (pgconn sends a cancel request from a
// connection it closes in mid-statement), so that one blocked on a lock
// (a locked table) fails at once and its process notices the closed
// connection.
//
// Nothing it waits for outlasts by: past it the statement is settled
// whatever the server says, and the lock it may have taken must go
// without waiting longer (a clean-up that waited up to cleanupTimeout per
// try for them kept the key from everyone).
//
// Asking costs a connection of the pool, taken through the gate, for the
// clean-up's polls. At most maxSettling clean-ups of a store ask at once;
// the others wait for by, which needs no connection. Attempts are cut off
// in numbers when the server or the machine is slow, and a clean-up per
// cut-off attempt, each making a cancel request of its own (a second one:
// pgconn had sent one) and polling around the gate, fed the storm of new
// connections the gate keeps attempts from making (issue 36: 294
// connections being made at once, 1 of 960 attempts granted, in a CI run
// on a loaded machine).
func (p *Postgres) settled(ctx context.Context, pc *pgconn.PgConn, by time.Time) error {
	if !time.Now().Before(by) {
		return nil
	}
	cctx, cancel := context.WithDeadline(ctx, by)
	defer cancel()
	if p.settling.Add(1) > maxSettling {
		p.settling.Add(-1)
		<-cctx.Done()
		if ctx.Err() != nil {
			return fmt.Errorf("waiting for the abandoned statement's bound: %w", ctx.Err())
		}
		return nil
	}
	defer p.settling.Add(-1)
	fail := func(err error) error {
		if ctx.Err() == nil && !time.Now().Before(by) {
			return nil // by came first: settled
		}
		return fmt.Errorf("waiting for the abandoned statement's server process: %w", err)
	}
	c, err := p.gate.conn(cctx, p.pool)
	if err != nil {
		return fail(err)
	}
	defer c.Release()
	for time.Now().Before(by) {
		var alive bool
		if err := c.QueryRow(cctx, `SELECT EXISTS (SELECT 1 FROM pg_stat_activity WHERE pid = $1)`, int64(pc.PID())).Scan(&alive); err != nil {
			return fail(err)
		}
		if !alive {
			return nil
		}
		t := time.NewTimer(min(settlePoll, time.Until(by)))
		select {
		case <-t.C:
		case <-cctx.Done():
			t.Stop()
			return fail(cctx.Err())
		}
	}
	return nil
}

// maxSettling is how many clean-ups of a store ask the server about their
// abandoned statements at once (see settled).
const maxSettling = 2

// settlePoll is how often settled looks for the server process.
const settlePoll = 10 * time.Millisecond

// pgReply is an acquire statement's reply.
type pgReply struct {
	ours        bool
	waited      bool // a mutex taken with others waiting behind
	token, left int64
	lim         int32 // a semaphore's limit, as its holders took it
	err         error
}

// acquireOn runs the acquire statement on c, bounded on the server by
// bound (0: unbounded).
func (p *Postgres) acquireOn(ctx context.Context, call *pgCall, c *pgxpool.Conn, l *backend.Lease, bound time.Duration) (r pgReply) {
	var b int64
	if bound > 0 {
		b = micros(bound)
	}
	if l.Kind == backend.KindMutex {
		return p.acquireDirect(ctx, call, c, l, b)
	}
	return p.acquireGroup(ctx, c, l, b, call.life)
}

// acquireGroup runs a semaphore's or read/write lock's acquire statement
// through pgx's query path (a function of its own: the scan's
// destinations escape). A refused read or write attempt records its
// intent for l.TTL; a refused semaphore attempt for life (see
// intentLife), when its acquisition waits (l.Waits) and life is left.
func (p *Postgres) acquireGroup(ctx context.Context, c *pgxpool.Conn, l *backend.Lease, b int64, life time.Duration) (r pgReply) {
	var tok, left *int64
	r.err = c.QueryRow(ctx, p.kAcq, bytesArg(l.Key), l.Value, micros(l.TTL), b, groupRow(l.Kind), mode(l.Kind), l.Limit, bytesArg(l.Label), groupIntentLife(l, life)).Scan(&tok, &r.lim, &left)
	if tok != nil {
		r.ours, r.token = true, *tok
	}
	if left != nil {
		r.left = *left
	}
	return r
}

// intentLife is the life of the intent a refused attempt of a waiting
// mutex or semaphore acquisition records: the lease's TTL, but no longer
// than the acquisition's context has left (its wait and the facade's
// grace) less headMargin, and 0 (no intent: the attempt does not queue)
// when less than headMargin is left. So the intent of a waiter that left lapses
// before its wait ends even if its withdrawal comes late or never (an
// attempt cut off at the end of the wait may commit after the
// withdrawal and renew the intent), and a release never keeps the lock
// for a head that has no time left to take it.
func intentLife(ctx context.Context, ttl time.Duration) time.Duration {
	dl, ok := ctx.Deadline()
	if !ok {
		return ttl
	}
	left := time.Until(dl) - headMargin
	if left <= 0 {
		return 0
	}
	return max(min(ttl, left), time.Microsecond)
}

// headMargin is how much of its wait a waiter keeps for taking the lock
// once it is the head: a release's notice and the head's attempt, a few
// milliseconds, tens under load (p90 5-50ms measured at load 10 on 2
// cores). A lock handed to a head with less left is most often lost: the
// head's attempt is cut off at the end of its wait, or the head has left,
// and the next in line waits for its withdrawal or its intent's lapse.
const headMargin = 50 * time.Millisecond

// finish turns an acquire statement's reply, read on c, into TryAcquire's
// result and gives c back to the pool. A lock taken after the caller gave
// up is deleted over c first, in the AbandonedError's Cleanup (the
// facade runs it at once, in the background): the pool's other
// connections may all be busy, or still being made, when such replies
// come (many contenders, short waits), and the lock must not stay taken
// by nobody until one is free.
func (p *Postgres) finish(ctx context.Context, c *pgxpool.Conn, l *backend.Lease, r pgReply, bound time.Duration) (bool, time.Duration, error) {
	if r.err != nil || !r.ours || ctx.Err() == nil {
		c.Release()
		return p.outcome(ctx, l, r, bound)
	}
	held := c
	return false, 0, &backend.AbandonedError{
		Err: fmt.Errorf("sqldb: postgres: acquire %q: taken after the caller gave up: %w", l.Key, ctx.Err()),
		Cleanup: func(ctx context.Context) error {
			if c := held; c != nil {
				held = nil
				err := p.cleanupOn(ctx, c, l)
				c.Release()
				if err == nil {
					return nil
				}
			}
			return p.cleanup(ctx, l) // the connection failed: any other
		},
	}
}

// outcome turns an acquire statement's reply into TryAcquire's result.
func (p *Postgres) outcome(ctx context.Context, l *backend.Lease, r pgReply, bound time.Duration) (bool, time.Duration, error) {
	switch {
	case r.err == nil && r.ours: // in time: finish saw to a late one
		l.Token = uint64(r.token)
		if r.waited {
			l.Handle = waitedFor
		}
		return true, 0, nil
	case r.err == nil && l.Kind == backend.KindSemaphore && r.lim != l.Limit:
		return false, 0, errLimitMismatch(l.Key, int(l.Limit), int(r.lim))
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
	f := new(pgFlight) // the statement may still be on its way
	l.Handle = f
	return false, 0, &backend.AbandonedError{
		Err: fmt.Errorf("sqldb: postgres: acquire %q: outcome unknown: %w", l.Key, r.err),
		Cleanup: func(ctx context.Context) error {
			f.settle()
			return p.cleanup(ctx, l)
		},
	}
}

// cleanup deletes l.Value's row of l.Key (or its grant and intent in a
// group's row), live or expired, for an AbandonedError's Cleanup; nil
// when there was none.
func (p *Postgres) cleanup(ctx context.Context, l *backend.Lease) error {
	return p.cleanupOn(ctx, nil, l)
}

// cleanupOn is cleanup over c, or over the pool when c is nil.
func (p *Postgres) cleanupOn(ctx context.Context, c *pgxpool.Conn, l *backend.Lease) error {
	cctx, cancel := cleanupContext(ctx)
	defer cancel()
	c, took, err := p.connOr(cctx, c)
	if err != nil {
		return fmt.Errorf("sqldb: postgres: clean up %q: %w", l.Key, err)
	}
	if took {
		defer c.Release()
	}
	_, err = p.release(cctx, c, l)
	if err == nil && (l.Kind == backend.KindRead || l.Kind == backend.KindWrite || l.Waits) {
		err = p.withdraw(cctx, c, l, 0) // the attempt may have queued; a marker goes
	}
	if err != nil {
		return fmt.Errorf("sqldb: postgres: clean up %q: %w", l.Key, err)
	}
	return nil
}

// undo deletes l.Value's row of l.Key, live or expired, after an acquire
// whose outcome is unknown, and returns err, with the delete's error if
// it failed.
func (p *Postgres) undo(ctx context.Context, l *backend.Lease, err error) error {
	cctx, cancel := cleanupContext(ctx)
	defer cancel()
	if cerr := p.cleanup(cctx, l); cerr != nil {
		err = fmt.Errorf("%w (not cleaned up: %w)", err, cerr)
	}
	return err
}

// pgFlight is a lease's Handle after an attempt abandoned with its
// statement in flight, shared by the copies of the lease: a withdrawal
// leaves a marker until the AbandonedError's Cleanup has found the
// statement settled (see Withdraw). The two are serialized by mu, so
// that a marker is never written after the Cleanup removed markers: a
// withdrawal slower than the facade waits for may come after it.
type pgFlight struct {
	mu      sync.Mutex
	settled bool
}

// settle records that the statement can no longer write, after any
// withdrawal under way.
func (f *pgFlight) settle() {
	f.mu.Lock()
	f.settled = true
	f.mu.Unlock()
}

// waitedFor is a mutex lease's Handle when others waited behind it as it
// was granted: its release takes the statement that wakes the next at
// once, without trying the plain DELETE first.
var waitedFor any = new(struct{ byte })

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
	live, err := p.release(ctx, nil, l)
	if err != nil {
		return fmt.Errorf("sqldb: postgres: release %q: %w", l.Key, err)
	}
	if !live {
		return backend.ErrNotHeld
	}
	return nil
}

// release deletes l's row, or its entry in a group's row, over c, or
// over the pool when c is nil (see Release); it reports whether l was
// live.
func (p *Postgres) release(ctx context.Context, c *pgxpool.Conn, l *backend.Lease) (live bool, err error) {
	c, took, err := p.connOr(ctx, c)
	if err != nil {
		return false, err
	}
	if took {
		defer c.Release()
	}
	if l.Kind != backend.KindMutex {
		return p.groupRemove(ctx, c, p.kRel, l)
	}
	m := p.mutex(l.Key)
	err = retryConflicts(pgContention, func() error {
		if l.Handle != waitedFor { // nobody waited when we took it
			n, err := p.relFastDirect(ctx, c, m, l)
			if err != nil || n == 1 {
				live = err == nil
				return err
			}
		}
		// Waited for, expired, or not ours: a statement that wakes
		// the waiters or the head of the line, or deletes our stale
		// row. A lock taken by an acquisition that did not wait in
		// line is most often contended by others that do not either:
		// the smaller relAlone first, then rel if it deleted nothing.
		// One taken by an acquisition that waits in line (l.Waits)
		// goes to rel at once: a waiter in line behind it is likely.
		var empty bool
		err = pgx.ErrNoRows
		if l.Handle != waitedFor && !l.Waits {
			err = c.QueryRow(ctx, m.relAlone, keyArg(l.Key), l.Value, p.channel, notifyPayload(l.Key)).Scan(&live, nil, &empty)
		}
		if errors.Is(err, pgx.ErrNoRows) {
			err = c.QueryRow(ctx, m.rel, keyArg(l.Key), l.Value, p.ln.qchannel, p.channel, notifyPayload(l.Key)).Scan(&live, nil, &empty)
		}
		if errors.Is(err, pgx.ErrNoRows) {
			live, err = false, nil
		}
		if err == nil && empty {
			_, err = c.Exec(ctx, m.gone, keyArg(l.Key))
		}
		return err
	})
	return live, err
}

// Withdraw implements backend.Withdrawer: it deletes l.Value's intent in
// l.Key's mutex, semaphore or read/write lock, if any, with the row when
// nothing else is left in it, and notifies the waiters when one tried
// meanwhile (for a mutex, the new head when the lock was kept for
// l.Value). For a semaphore whose acquisition does not wait in line
// (l.Waits unset) it returns nil without I/O: its attempts record no
// intent.
//
// When the last attempt of l was abandoned with its statement in flight
// (TryAcquire returned a [backend.AbandonedError] for it), that statement
// may still reach the server after the withdrawal and queue l.Value
// again, or take the lock. So the withdrawal of a mutex's waiter then
// leaves a marker of l.Value in the row, for l.TTL at most (the life of
// any intent the statement could record), which the acquire statements
// honour: they neither queue l.Value nor take the lock for it while it
// lives. The row is kept while a marker lives; the AbandonedError's
// Cleanup, which runs once the statement can no longer write, removes
// the marker and deletes the row if nothing else is left in it (a
// withdrawal after that Cleanup leaves no marker).
func (p *Postgres) Withdraw(ctx context.Context, l *backend.Lease) error {
	if err := p.ValidateKey(l.Key); err != nil {
		return err
	}
	if l.Kind == backend.KindSemaphore && !l.Waits {
		return nil // its attempts record no intent: nothing to withdraw
	}
	var mark time.Duration
	if f, ok := l.Handle.(*pgFlight); ok {
		f.mu.Lock()
		defer f.mu.Unlock()
		if !f.settled {
			mark = l.TTL
		}
	}
	if err := p.withdraw(ctx, nil, l, mark); err != nil {
		return fmt.Errorf("sqldb: postgres: withdraw %q: %w", l.Key, err)
	}
	return nil
}

// withdraw deletes l.Value's intent; for a mutex, it leaves l.Value's
// marker for mark instead of deleting the row (mark > 0), or removes
// the marker too (mark == 0).
func (p *Postgres) withdraw(ctx context.Context, c *pgxpool.Conn, l *backend.Lease, mark time.Duration) error {
	c, took, err := p.connOr(ctx, c)
	if err != nil {
		return err
	}
	if took {
		defer c.Release()
	}
	if l.Kind != backend.KindMutex {
		_, err := p.groupRemove(ctx, c, p.kWithdraw, l)
		return err
	}
	m := p.mutex(l.Key)
	return retryConflicts(pgContention, func() error {
		var empty bool
		var life int64 // no marker
		if mark > 0 {
			life = micros(mark)
		}
		err := c.QueryRow(ctx, m.withdraw, keyArg(l.Key), l.Value, p.ln.qchannel, life).Scan(nil, &empty)
		if errors.Is(err, pgx.ErrNoRows) {
			return nil
		}
		if err == nil && empty {
			_, err = c.Exec(ctx, m.gone, keyArg(l.Key))
		}
		return err
	})
}

// groupRemove runs a groupRemove statement for l, and deletes the row
// if that left it empty. It reports whether l's entry was live.
func (p *Postgres) groupRemove(ctx context.Context, c *pgxpool.Conn, stmt string, l *backend.Lease) (live bool, err error) {
	var empty bool
	err = retryConflicts(pgContention, func() error {
		err := c.QueryRow(ctx, stmt, bytesArg(l.Key), l.Value, groupRow(l.Kind), mode(l.Kind), p.channel, notifyPayload(l.Key), p.ln.qchannel).Scan(&live, nil, &empty)
		if errors.Is(err, pgx.ErrNoRows) {
			live, err = false, nil
		}
		return err
	})
	if err == nil && empty {
		err = retryConflicts(pgContention, func() error {
			_, err := c.Exec(ctx, p.kGone, bytesArg(l.Key), groupRow(l.Kind))
			return err
		})
	}
	return live, err
}

// connOr returns c when it is not nil, else a connection of the pool
// taken through the gate (see connGate: a release, a clean-up or a
// renewal whose context ends while the pool makes a connection leaves
// one more being made, as an acquire attempt would); took says the
// caller must give it back.
func (p *Postgres) connOr(ctx context.Context, c *pgxpool.Conn) (_ *pgxpool.Conn, took bool, err error) {
	switch {
	case c != nil:
		return c, false, nil
	case ctx.Done() == nil:
		// It cannot end while a connection is made for it: no need to
		// wait for the gate (a release under context.Background must
		// not keep the lock longer).
		c, err = p.pool.Acquire(ctx)
	default:
		c, err = p.gate.conn(ctx, p.pool)
	}
	if err != nil {
		return nil, false, err
	}
	return c, true, nil
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
	c, _, err := p.connOr(ctx, nil)
	if err == nil {
		err = retryConflicts(pgContention, func() (err error) {
			if l.Kind == backend.KindMutex {
				tag, err = c.Exec(ctx, p.mutex(l.Key).ref, keyArg(l.Key), l.Value, micros(l.TTL))
			} else {
				tag, err = c.Exec(ctx, p.kRef, bytesArg(l.Key), l.Value, groupRow(l.Kind), mode(l.Kind), micros(l.TTL))
			}
			return err
		})
		c.Release()
	}
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

// SubscribeHead implements [backend.HeadNotifier]: ch receives the
// release notices of key addressed to the queued waiter value (its turn:
// the lock is free and kept for it), those of key
// addressed to nobody in particular (a release with nobody queued), and
// at once one addressed to value that came within the last second,
// before the subscription. Subscribe's rules hold otherwise.
func (p *Postgres) SubscribeHead(key, value string) (ch <-chan struct{}, cancel func()) {
	return p.ln.subscribeHead(key, value)
}

// Queues implements [backend.Queuer]: PostgreSQL queues the waiters of
// mutexes and semaphores (and the requests of read/write locks) in
// arrival order.
func (p *Postgres) Queues(k backend.Kind) bool {
	return k == backend.KindMutex || k == backend.KindSemaphore
}

// MinQueueWait implements [backend.MinQueueWaiter]: a mutex's or a
// semaphore's line serves waits of a second or more (lineMinWait);
// shorter waits do not queue, and take the lock (a permit) only while
// nobody waits in line (while more permits are free than waiters wait).
func (p *Postgres) MinQueueWait(backend.Kind) time.Duration { return lineMinWait }

// lineMinWait is the shortest wait that joins a mutex's or a semaphore's
// line. A semaphore's line passes a freed permit on as a mutex's passes
// the lock: a release's notice and the next waiter's attempt, while the
// permit waits for the first waiters in line (a head near the end of its
// wait holds it back from those behind until it withdraws), so the same
// bound serves both. A mutex's line hands the lock on one waiter at a
// time, each handoff a release with its NOTIFY and the head's attempt:
// measured at load 11 on 2 cores, a grant every 38ms with 20ms holds
// (about 18ms of handoff), so a wait reaches the head past about 10
// waiters in 200ms, 50 in a second. With 200ms waits and 12 waiters (3
// processes x 4, 1ms holds) the line granted 228-538 of 600 against
// 33-584 without it; with 3s waits (20ms holds) 120/120 at 3 processes
// and 477/480 at 12 (3.06 and 3.14 requests per grant) against 120 and
// 447 (6.87 and 19.90).
const lineMinWait = time.Second

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
