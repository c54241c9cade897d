package main

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/distlock/distlock"
)

// The PostgreSQL floors of the kinds workloads: bare pgx, one statement
// per attempt on one row per lock (its holders in jsonb, expiries in
// microseconds by the server's clock), polled every cfg.retry. The upsert
// locks the row and decides on its latest version (ON CONFLICT DO UPDATE
// reads it whatever the statement's snapshot), so concurrent attempts
// never exceed the rule. No token, no limit check, no wake-up; rows stay
// (one per key), emptied by the releases.
func init() {
	registerKindsFloor(wlSemaphore, &kindsPeer{
		name: "floor", store: "postgres", ref: true, serverRequests: true,
		note:     "bare pgx: one INSERT .. ON CONFLICT DO UPDATE per attempt on the semaphore's row (live holders in jsonb, counted against the limit), one UPDATE to release; retry every 10ms",
		open:     openPGKindsFloor,
		counters: pgCounters,
	})
	registerKindsFloor(wlReadMostly, &kindsPeer{
		name: "floor", store: "postgres", ref: true, serverRequests: true,
		note:     "bare pgx, writer-preferring, on the lock's row: a reader's upsert holds when no writer holds and no writer waits; a writer's holds when nobody holds, else it records its intent, which keeps new readers out; one UPDATE to release, one to withdraw the intent when a writer gives up; retry every 10ms",
		open:     openPGKindsFloor,
		counters: pgCounters,
	})
}

// pgNowUS is the server's clock (the transaction's start: the statement's,
// in autocommit) in microseconds.
const pgNowUS = `(extract(epoch FROM now()) * 1000000)::bigint`

const (
	pgKindsFloorTables = `CREATE TABLE IF NOT EXISTS bare_sems (
  lock_key text COLLATE "C" PRIMARY KEY,
  holders  jsonb NOT NULL -- owner -> expiry (µs)
);
CREATE TABLE IF NOT EXISTS bare_rw (
  lock_key text COLLATE "C" PRIMARY KEY,
  readers  jsonb NOT NULL DEFAULT '{}',  -- owner -> expiry (µs)
  writer   text NOT NULL DEFAULT '',
  wexp     bigint NOT NULL DEFAULT 0,    -- the writer's expiry (µs)
  intents  jsonb NOT NULL DEFAULT '{}'   -- waiting writers: owner -> expiry (µs)
)`
	// $1 key, $2 owner, $3 TTL (µs), $4 limit.
	pgFloorSemAcquire = `INSERT INTO bare_sems AS s (lock_key, holders)
VALUES ($1, jsonb_build_object($2::text, ` + pgNowUS + ` + $3::bigint))
ON CONFLICT (lock_key) DO UPDATE
SET holders = (SELECT coalesce(jsonb_object_agg(e.key, e.value), '{}') FROM jsonb_each_text(s.holders) e
    WHERE e.value::bigint > ` + pgNowUS + `) || EXCLUDED.holders
WHERE (SELECT count(*) FROM jsonb_each_text(s.holders) e WHERE e.value::bigint > ` + pgNowUS + `) < $4::int
RETURNING true`
	// $1 key, $2 owner.
	pgFloorSemRelease = `UPDATE bare_sems SET holders = holders - $2::text WHERE lock_key = $1 AND holders ? $2::text`

	// $1 key, $2 owner, $3 TTL (µs).
	pgFloorReadAcquire = `INSERT INTO bare_rw AS s (lock_key, readers)
VALUES ($1, jsonb_build_object($2::text, ` + pgNowUS + ` + $3::bigint))
ON CONFLICT (lock_key) DO UPDATE
SET readers = (SELECT coalesce(jsonb_object_agg(e.key, e.value), '{}') FROM jsonb_each_text(s.readers) e
    WHERE e.value::bigint > ` + pgNowUS + `) || EXCLUDED.readers
WHERE s.wexp <= ` + pgNowUS + `
  AND NOT EXISTS (SELECT FROM jsonb_each_text(s.intents) e WHERE e.value::bigint > ` + pgNowUS + `)
RETURNING true`
	pgFloorWriteAcquire = `INSERT INTO bare_rw AS s (lock_key, writer, wexp)
VALUES ($1, $2::text, ` + pgNowUS + ` + $3::bigint)
ON CONFLICT (lock_key) DO UPDATE
SET (readers, writer, wexp, intents) = (
  SELECT d.r,
    CASE WHEN d.ok THEN $2::text ELSE s.writer END,
    CASE WHEN d.ok THEN d.n + $3::bigint ELSE s.wexp END,
    CASE WHEN d.ok THEN d.i - $2::text ELSE d.i || jsonb_build_object($2::text, d.n + $3::bigint) END
  FROM (SELECT c.*, s.wexp <= c.n AND c.r = '{}'::jsonb AS ok
    FROM (SELECT n.n,
        (SELECT coalesce(jsonb_object_agg(e.key, e.value), '{}') FROM jsonb_each_text(s.readers) e WHERE e.value::bigint > n.n) AS r,
        (SELECT coalesce(jsonb_object_agg(e.key, e.value), '{}') FROM jsonb_each_text(s.intents) e WHERE e.value::bigint > n.n) AS i
      FROM (SELECT ` + pgNowUS + ` AS n) n) c) d)
RETURNING s.writer = $2::text`
	// $1 key, $2 owner.
	pgFloorReadRelease  = `UPDATE bare_rw SET readers = readers - $2::text WHERE lock_key = $1 AND readers ? $2::text`
	pgFloorWriteRelease = `UPDATE bare_rw SET writer = '', wexp = 0 WHERE lock_key = $1 AND writer = $2::text`
	pgFloorWithdraw     = `UPDATE bare_rw SET intents = intents - $2::text WHERE lock_key = $1 AND intents ? $2::text`
)

// pgKindsFloor is the bare floor (pool, TTL, values) with the kinds'
// statements.
type pgKindsFloor struct{ *pgFloor }

var _ kindsInstance = pgKindsFloor{}

func openPGKindsFloor(ctx context.Context, s *servers, o openOpts, _ string) (kindsInstance, error) {
	f, err := newPGFloor(ctx, s, o, pgKindsFloorTables)
	if err != nil {
		return nil, err
	}
	return pgKindsFloor{f}, nil
}

// try makes one attempt: false when the rule keeps it out.
func (f pgKindsFloor) try(ctx context.Context, key, v string, kind distlock.Kind, limit int) (bool, error) {
	var (
		ok  bool
		err error
	)
	switch kind {
	case distlock.KindSemaphore:
		err = f.pool.QueryRow(ctx, pgFloorSemAcquire, key, v, f.micros, limit).Scan(&ok)
	case distlock.KindRead:
		err = f.pool.QueryRow(ctx, pgFloorReadAcquire, key, v, f.micros).Scan(&ok)
	case distlock.KindWrite:
		err = f.pool.QueryRow(ctx, pgFloorWriteAcquire, key, v, f.micros).Scan(&ok)
	default:
		return false, fmt.Errorf("floor: kind %v", kind)
	}
	if errors.Is(err, pgx.ErrNoRows) {
		return false, nil
	}
	return ok, err
}

func (f pgKindsFloor) acquireKind(ctx context.Context, key string, kind distlock.Kind, limit int, wait time.Duration) (held, error) {
	v := f.value()
	err := pollFloor(ctx, wait, f.retry, func() (bool, error) { return f.try(ctx, key, v, kind, limit) })
	if err == nil {
		return &pgKindsHeld{f: f, kind: kind, key: key, val: v}, nil
	}
	if errors.Is(err, errNotAcquired) && kind == distlock.KindWrite { // give up: the intent goes
		if _, err := f.pool.Exec(ctx, pgFloorWithdraw, key, v); err != nil {
			return nil, err
		}
	}
	return nil, err
}

// pgKindsHeld is what a user of the floor keeps: key and value.
type pgKindsHeld struct {
	f        pgKindsFloor
	kind     distlock.Kind
	key, val string
}

func (h *pgKindsHeld) unlock(ctx context.Context) error {
	stmt := pgFloorSemRelease
	switch h.kind {
	case distlock.KindRead:
		stmt = pgFloorReadRelease
	case distlock.KindWrite:
		stmt = pgFloorWriteRelease
	}
	tag, err := h.f.pool.Exec(ctx, stmt, h.key, h.val)
	if err == nil && tag.RowsAffected() != 1 {
		err = errors.New("floor: not held at release")
	}
	return err
}
