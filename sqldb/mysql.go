package sqldb

import (
	"context"
	"database/sql"
	"encoding/hex"
	"errors"
	"fmt"
	"hash/crc32"
	"net"
	"strconv"
	"strings"
	"time"

	"github.com/go-sql-driver/mysql"

	"github.com/distlock/distlock/backend"
)

var (
	_ backend.Spinner            = (*MySQL)(nil)
	_ backend.Refresher          = (*MySQL)(nil)
	_ backend.KeyValidator       = (*MySQL)(nil)
	_ interface{ Close() error } = (*MySQL)(nil)
)

// contendedBit marks the value the acquire statement leaves in
// LAST_INSERT_ID() when a live owner holds the key; the low bits are then
// the holder's remaining microseconds. Tokens never reach 2^63.
const contendedBit = 1 << 63

// Fencing counters. Each key draws its tokens from one of tokenBuckets
// counter rows in the lock table, keyed counterPrefix + the bucket number
// in decimal; the bucket is crc32 (IEEE) of the key modulo tokenBuckets.
// One counter per key would keep a row per key ever locked; one for the
// table made every acquire wait for every other's commit. Both the prefix
// and the bucket function are part of the table's format: a key must map
// to the same counter in every process, always, or its tokens could go
// backwards.
const (
	counterPrefix = "\x00distlock:token:"
	tokenBuckets  = 1024
)

// counterKey returns the lock_key of the counter row key draws from.
func counterKey(key string) string {
	return counterPrefix + strconv.FormatUint(uint64(crc32.ChecksumIEEE([]byte(key))%tokenBuckets), 10)
}

// MySQL is a lock table in MySQL or MariaDB, reached through database/sql
// with github.com/go-sql-driver/mysql. Make one with [NewMySQL]. It is
// safe for concurrent use. It has no wake-up channel: waiters spin.
type MySQL struct {
	db    *sql.DB
	table string

	acq, rel, relAny, ref, inspect, refAll, heldAll *sql.Stmt
	// acqBounded[i] is acq cut by the server (max_statement_time) at
	// boundRungs[i]; all nil on servers without SET STATEMENT (MySQL).
	acqBounded [len(boundRungs)]*sql.Stmt
	// Semaphores and read/write locks, on the kinds table (see
	// kindStmts).
	kAcq                                      *sql.Stmt
	kAcqArgs                                  []string // its parameters' names
	kAcqBounded                               [len(boundRungs)]*sql.Stmt
	kRel, kRelAny, kWdr, kWdrAny, kGone, kRef namedStmt
	kInspect                                  *sql.Stmt
	// relabel and held are the statements of Relabel, not prepared: an
	// election's leader proclaims seldom.
	relabel, held string
}

// boundRungs are the server-side bounds the acquire statement is prepared
// with on MariaDB. Its bound is a constant of its text, so an attempt
// takes the shortest rung not below the time left until its context's
// deadline (see maxStatementTime): a handful of prepared statements
// instead of one per deadline.
var boundRungs = [...]time.Duration{250 * time.Millisecond, 500 * time.Millisecond, time.Second, 2 * time.Second, maxStatementTime}

// NewMySQL returns a lock backend over db, creating the lock table and its
// fencing counter row if absent. Any DSN works (parseTime is not needed:
// times are computed in SQL and never scanned). The caller owns db:
// [MySQL.Close] closes only the prepared statements. Options: [WithTable].
//
// Its I/O is bounded by ctx, or by [DefaultSetupTimeout] when ctx has no
// deadline. It returns an error wrapping backend.ErrInvalid
// (distlock.ErrInvalid) for a nil ctx or db or a bad option, before any
// I/O, and the database's error, wrapped, when the table cannot be checked
// or created or the statements cannot be prepared.
func NewMySQL(ctx context.Context, db *sql.DB, opts ...Option) (*MySQL, error) {
	switch {
	case ctx == nil:
		return nil, fmt.Errorf("sqldb: NewMySQL: %w: nil context", backend.ErrInvalid)
	case db == nil:
		return nil, fmt.Errorf("sqldb: NewMySQL: %w: nil db", backend.ErrInvalid)
	}
	c, err := buildConfig("NewMySQL", opts)
	if err != nil {
		return nil, err
	}
	q := "`" + strings.Join(c.table, "`.`") + "`"
	kq := "`" + strings.Join(c.table, "`.`") + kindsSuffix + "`"
	m := &MySQL{db: db, table: c.tableName(),
		relabel: `UPDATE ` + q + ` SET label = ? WHERE lock_key = ? AND owner = ? AND expires_at > UTC_TIMESTAMP(6)`,
		held:    `SELECT 1 FROM ` + q + ` WHERE lock_key = ? AND owner = ? AND expires_at > UTC_TIMESTAMP(6)`}
	sctx, cancel := setupContext(ctx)
	defer cancel()
	ctx = sctx
	if err := m.createTable(ctx, q, kq); err != nil {
		return nil, setupError(ctx, err)
	}
	prep := func(query string) *sql.Stmt {
		if err != nil {
			return nil
		}
		var st *sql.Stmt
		st, err = db.PrepareContext(ctx, query)
		return st
	}
	// One statement, two rows, in this order. Row 1 is the key's fencing
	// counter (see counterKey): when it exists it takes the UPDATE branch,
	// bumps the counter and leaves it in LAST_INSERT_ID(); when it does not
	// (the bucket's first acquire, or someone deleted it) it is created at
	// the server's time in microseconds since 1970, above any count of
	// acquisitions so far, so tokens still increase. Its row lock, held
	// until the statement commits, orders the token draws of the keys in
	// its bucket by commit; keys of other buckets do not wait for it. Row 2
	// is the lock: a new row takes the counter value; an existing row
	// whose lease ran out by the server's clock is taken over with it; a
	// live row is left alone and LAST_INSERT_ID() is set to contendedBit |
	// the holder's remaining microseconds instead. A row is a counter iff
	// its key starts with counterPrefix (ValidateKey refuses such keys).
	// The SET list is evaluated left to right, so expires_at is assigned
	// last and the conditions before it read the old value.
	// UTC_TIMESTAMP(6) is fixed for the statement and independent of the
	// session's time zone. The client reads the outcome from the OK
	// packet's insert id: no second round trip.
	isCounter := `LEFT(lock_key, ` + strconv.Itoa(len(counterPrefix)) + `) = X'` + hex.EncodeToString([]byte(counterPrefix)) + `'`
	acqSQL := `INSERT INTO ` + q + ` (lock_key, owner, token, expires_at, label) VALUES
  (?, '', LAST_INSERT_ID(TIMESTAMPDIFF(MICROSECOND, '1970-01-01', UTC_TIMESTAMP(6))), '9999-12-31 23:59:59', ''),
  (?, ?, LAST_INSERT_ID(), UTC_TIMESTAMP(6) + INTERVAL ? MICROSECOND, ?)
ON DUPLICATE KEY UPDATE
  owner = IF(` + isCounter + ` OR expires_at > UTC_TIMESTAMP(6), owner, ?),
  label = IF(` + isCounter + ` OR expires_at > UTC_TIMESTAMP(6), label, VALUES(label)),
  token = IF(` + isCounter + `, LAST_INSERT_ID(token + 1),
          IF(expires_at > UTC_TIMESTAMP(6),
             token + 0 * LAST_INSERT_ID(9223372036854775808 | TIMESTAMPDIFF(MICROSECOND, UTC_TIMESTAMP(6), expires_at)),
             LAST_INSERT_ID())),
  expires_at = IF(` + isCounter + ` OR expires_at > UTC_TIMESTAMP(6), expires_at,
                  UTC_TIMESTAMP(6) + INTERVAL ? MICROSECOND)`
	m.acq = prep(acqSQL)
	// MariaDB's SET STATEMENT bounds one statement on the server: past
	// max_statement_time it is interrupted wherever it waits (the table's
	// metadata lock, a row lock) and rolled back. MySQL has no such
	// syntax; there the acquire runs unbounded (see TryAcquire).
	for i, b := range boundRungs {
		if err != nil {
			break
		}
		st, perr := db.PrepareContext(ctx, `SET STATEMENT max_statement_time=`+strconv.FormatFloat(b.Seconds(), 'f', -1, 64)+` FOR `+acqSQL)
		var me *mysql.MySQLError
		if i == 0 && errors.As(perr, &me) && me.Number == 1064 { // ER_PARSE_ERROR: not MariaDB
			break
		}
		m.acqBounded[i], err = st, perr
	}
	m.rel = prep(`DELETE FROM ` + q + ` WHERE lock_key = ? AND owner = ? AND expires_at > UTC_TIMESTAMP(6)`)
	m.relAny = prep(`DELETE FROM ` + q + ` WHERE lock_key = ? AND owner = ?`)
	m.ref = prep(`UPDATE ` + q + ` SET expires_at = UTC_TIMESTAMP(6) + INTERVAL ? MICROSECOND
WHERE lock_key = ? AND owner = ? AND expires_at > UTC_TIMESTAMP(6)`)
	m.inspect = prep(`SELECT token, TIMESTAMPDIFF(MICROSECOND, UTC_TIMESTAMP(6), expires_at), label FROM ` + q + `
WHERE lock_key = ? AND expires_at > UTC_TIMESTAMP(6)`)
	// A batch of renewals: the leases as a JSON document (keys and owners
	// in hex, TTLs, numbers), joined to the table by its primary key.
	batch := `JSON_TABLE(?, '$[*]' COLUMNS (i INT PATH '$.i', k VARCHAR(600) PATH '$.k', o VARCHAR(600) PATH '$.o', t BIGINT PATH '$.t')) u`
	m.refAll = prep(`UPDATE ` + batch + ` STRAIGHT_JOIN ` + q + ` l ON l.lock_key = UNHEX(u.k) AND l.owner = UNHEX(u.o)
SET l.expires_at = UTC_TIMESTAMP(6) + INTERVAL u.t MICROSECOND
WHERE l.expires_at > UTC_TIMESTAMP(6)`)
	m.heldAll = prep(`SELECT u.i FROM ` + batch + ` STRAIGHT_JOIN ` + q + ` l ON l.lock_key = UNHEX(u.k) AND l.owner = UNHEX(u.o)
WHERE l.expires_at > UTC_TIMESTAMP(6)`)
	if err == nil {
		err = m.kindStmts(ctx, kq, prep)
	}
	if err != nil {
		m.Close()
		return nil, setupError(ctx, fmt.Errorf("sqldb: mysql: prepare statements for %s: %w", m.table, err))
	}
	return m, nil
}

// createTable creates the table q and the kinds table kq if either does
// not exist. The fencing counter rows come with the first acquire of a key
// in their bucket.
func (m *MySQL) createTable(ctx context.Context, q, kq string) error {
	ready, err := m.tablesExist(ctx, q, kq)
	if err != nil || ready {
		return err // existing tables need no CREATE privilege
	}
	for _, st := range []string{`CREATE TABLE IF NOT EXISTS ` + q + ` (
  lock_key   VARBINARY(255) NOT NULL PRIMARY KEY,
  owner      VARBINARY(255) NOT NULL,
  token      BIGINT UNSIGNED NOT NULL,
  expires_at DATETIME(6) NOT NULL,
  label      VARBINARY(256) NOT NULL DEFAULT ''
) ENGINE=InnoDB`, `CREATE TABLE IF NOT EXISTS ` + kq + ` (
  lock_key   VARBINARY(255) NOT NULL,
  kind       TINYINT UNSIGNED NOT NULL,
  token      BIGINT UNSIGNED NOT NULL,
  expires_at DATETIME(6) NOT NULL,
  lim        INT NOT NULL DEFAULT 0,
  state      LONGTEXT,
  PRIMARY KEY (lock_key, kind)
) ENGINE=InnoDB`} {
		if _, err := m.db.ExecContext(ctx, st); err != nil {
			return fmt.Errorf("sqldb: mysql: create table %s: %w", m.table, err)
		}
	}
	return nil
}

// tablesExist reports whether the tables q and kq both exist.
func (m *MySQL) tablesExist(ctx context.Context, q, kq string) (bool, error) {
	for _, t := range []string{q, kq} {
		// A query, not Exec: go-sql-driver v1.10 hangs when a SELECT goes
		// through Exec on a server-side prepared statement, which is what
		// database/sql does for connectors without ExecerContext (wrappers
		// for tracing, say).
		rows, err := m.db.QueryContext(ctx, `SELECT 1 FROM `+t+` LIMIT 0`)
		if err == nil {
			err = rows.Close()
		}
		var me *mysql.MySQLError
		switch {
		case err == nil:
		case errors.As(err, &me) && me.Number == 1146: // ER_NO_SUCH_TABLE
			return false, nil
		default:
			return false, fmt.Errorf("sqldb: mysql: check table %s: %w", m.table, err)
		}
	}
	return true, nil
}

// Table returns the lock table's name as given to [WithTable] (or
// [DefaultTable]).
func (m *MySQL) Table() string { return m.table }

// ValidateKey reports whether key fits the lock_key column: non-empty, at
// most [MaxKeyLen] bytes, and not starting with the bytes
// "\x00distlock:token:" (such keys name the fencing counter rows). It does
// no I/O.
func (m *MySQL) ValidateKey(key string) error {
	if err := validateKey(key, unitBytes); err != nil {
		return err
	}
	if strings.HasPrefix(key, counterPrefix) {
		return fmt.Errorf("sqldb: key %s is reserved: keys starting with %q name the fencing counters", shortQuote(key), counterPrefix)
	}
	return nil
}

func (m *MySQL) validate(l *backend.Lease) error {
	if err := m.ValidateKey(l.Key); err != nil {
		return err
	}
	if len(l.Value) > maxOwnerLen {
		return fmt.Errorf("sqldb: owner value is %d bytes long; the owner column holds at most %d", len(l.Value), maxOwnerLen)
	}
	return nil
}

// TryAcquire makes one attempt to take l.Key for l.TTL by the database's
// clock, in one statement. On success it sets l.Token from the key's
// counter row (one of 1024 in the table, chosen by a hash of the key).
// When a live owner holds the key it returns acquired == false, a nil
// error and the holder's remaining time as holderTTL. A deadlock or lock
// wait timeout (errors 1213, 1205) is also reported as acquired == false
// with a nil error: it is contention, and the facade's spin loop retries.
//
// It returns when ctx ends, whatever the database does: a statement then
// in flight (the table locked by another session, say) is abandoned with
// a [backend.AbandonedError], whose Cleanup waits for the statement's
// reply and deletes l.Value's row if the statement wrote it after all, or
// if no reply came (the connection is dropped a second past the
// statement's server-side bound). On MariaDB the server cuts the
// statement (max_statement_time) at the time left until ctx's deadline,
// rounded up to 250ms, 500ms, 1s or 2s, and at most 5s: past it the
// statement writes nothing, so an abandoned attempt takes no key later.
// A statement cut so while ctx lives fails with an error wrapping
// [context.DeadlineExceeded]. MySQL, which has no per-statement time
// limit for an INSERT, runs it unbounded: there an abandoned statement
// that the server runs later than that second may write a row that
// nobody deletes before its TTL. A row taken as ctx ended is deleted in
// Cleanup too. A statement whose connection fails (its outcome unknown)
// returns the error as an AbandonedError whose Cleanup deletes l.Value's
// row; when ctx cannot end, TryAcquire deletes it itself before
// returning. (With SetMaxOpenConns, a wait for a free connection runs in
// the abandoned statement's goroutine past ctx's end: database/sql has no
// way to prepare once per connection and pick the connection first. The
// statement may then be sent after ctx ended; Cleanup still waits for
// its reply.) An owner value over 255 bytes is an error, without I/O.
func (m *MySQL) TryAcquire(ctx context.Context, l *backend.Lease) (bool, time.Duration, error) {
	if err := m.validate(l); err != nil {
		return false, 0, err
	}
	var args []any
	acquireStmt := m.acquireStmt
	if l.Kind == backend.KindMutex {
		ttl := micros(l.TTL)
		args = []any{counterKey(l.Key), l.Key, l.Value, ttl, l.Label, l.Value, ttl}
	} else {
		args, acquireStmt = m.kindArgs(l, intentLife(ctx, l.TTL)), m.kindStmt
	}
	if ctx.Done() == nil { // nothing can end the call: no flight, no bound
		st := m.acq
		if l.Kind != backend.KindMutex {
			st = m.kAcq
		}
		return m.outcome(ctx, l, m.acquireWith(ctx, st, args), 0)
	}
	if err := ctx.Err(); err != nil {
		return false, 0, fmt.Errorf("sqldb: mysql: acquire %q: %w", l.Key, err)
	}
	st, bound := acquireStmt(statementBound(ctx))
	// The driver drops the connection when sctx ends: only if no reply
	// came by replyBy after the caller gave up.
	sctx, stop := context.WithCancel(context.WithoutCancel(ctx))
	f := newFlight[myReply](bound)
	go func() {
		r := m.acquireWith(sctx, st, args)
		stop()
		f.finish(r, func(bool) {}) // database/sql settles the connection
	}()
	if r, ok := f.wait(ctx, nil); ok {
		return m.outcome(ctx, l, r, bound)
	}
	time.AfterFunc(time.Until(f.replyBy()), stop)
	return false, 0, &backend.AbandonedError{
		Err: fmt.Errorf("sqldb: mysql: acquire %q: gave up with the statement in flight: %w", l.Key, ctx.Err()),
		Cleanup: func(ctx context.Context) error {
			r, err := f.await(ctx)
			if err != nil {
				return fmt.Errorf("sqldb: mysql: clean up %q: %w", l.Key, err)
			}
			if r.err != nil && !myAmbiguous(r.err) ||
				r.err == nil && (r.id == 0 || uint64(r.id)&(contendedBit|mismatchBit) != 0) && !recordsIntent(l) {
				return nil // it wrote nothing (a read or write attempt that did not hold recorded an intent)
			}
			return m.cleanup(ctx, l)
		},
	}
}

// acquireStmt returns the acquire statement bounded on the server by the
// shortest rung not below bound, and that rung; the unbounded one and 0
// on MySQL.
func (m *MySQL) acquireStmt(bound time.Duration) (*sql.Stmt, time.Duration) {
	if m.acqBounded[0] == nil {
		return m.acq, 0
	}
	for i, b := range boundRungs {
		if b >= bound {
			return m.acqBounded[i], b
		}
	}
	return m.acqBounded[len(boundRungs)-1], boundRungs[len(boundRungs)-1]
}

// myReply is an acquire statement's reply: LAST_INSERT_ID() or an error.
type myReply struct {
	id  int64
	err error
}

func (m *MySQL) acquireWith(ctx context.Context, st *sql.Stmt, args []any) (r myReply) {
	res, err := st.ExecContext(ctx, args...)
	if err == nil {
		r.id, err = res.LastInsertId()
	}
	r.err = err
	return r
}

// outcome turns an acquire statement's reply into TryAcquire's result.
func (m *MySQL) outcome(ctx context.Context, l *backend.Lease, r myReply, bound time.Duration) (bool, time.Duration, error) {
	switch {
	case r.err == nil:
	case myContention(r.err):
		return false, 0, nil
	case myLate(r.err):
		return false, 0, fmt.Errorf("sqldb: mysql: acquire %q: %w", l.Key, lateError(bound, r.err))
	case !myAmbiguous(r.err):
		return false, 0, fmt.Errorf("sqldb: mysql: acquire %q: %w", l.Key, r.err)
	case ctx.Done() == nil:
		return false, 0, fmt.Errorf("sqldb: mysql: acquire %q: %w", l.Key, m.undo(ctx, l, r.err))
	default:
		return false, 0, &backend.AbandonedError{
			Err:     fmt.Errorf("sqldb: mysql: acquire %q: outcome unknown: %w", l.Key, r.err),
			Cleanup: func(ctx context.Context) error { return m.cleanup(ctx, l) },
		}
	}
	u := uint64(r.id)
	if lim, ok := myMismatch(u); ok && l.Kind == backend.KindSemaphore {
		return false, 0, errLimitMismatch(l.Key, int(l.Limit), lim)
	}
	if u&contendedBit != 0 {
		return false, time.Duration(u&^contendedBit) * time.Microsecond, nil
	}
	if u == 0 {
		return false, 0, fmt.Errorf("sqldb: mysql: acquire %q: the statement returned no token (is the driver passing LAST_INSERT_ID through?)", l.Key)
	}
	if err := ctx.Err(); err != nil {
		// The caller gave up before the reply came: the row goes again.
		return false, 0, &backend.AbandonedError{
			Err:     fmt.Errorf("sqldb: mysql: acquire %q: taken after the caller gave up: %w", l.Key, err),
			Cleanup: func(ctx context.Context) error { return m.cleanup(ctx, l) },
		}
	}
	l.Token = u
	return true, 0, nil
}

// cleanup deletes l.Value's row of l.Key, live or expired, for an
// AbandonedError's Cleanup; nil when there was none.
func (m *MySQL) cleanup(ctx context.Context, l *backend.Lease) error {
	cctx, cancel := cleanupContext(ctx)
	defer cancel()
	if err := m.deleteAny(cctx, l); err != nil {
		return fmt.Errorf("sqldb: mysql: clean up %q: %w", l.Key, err)
	}
	return nil
}

// deleteAny deletes l.Value's row of l.Key, or its grant and intent in a
// group's row, live or expired.
func (m *MySQL) deleteAny(ctx context.Context, l *backend.Lease) error {
	if l.Kind == backend.KindMutex {
		_, err := m.exec(ctx, m.relAny, l.Key, l.Value)
		return err
	}
	_, err := m.groupRemove(ctx, m.kRel, m.kRelAny, l)
	if err == nil && recordsIntent(l) {
		_, err = m.groupRemove(ctx, m.kWdr, m.kWdrAny, l)
	}
	return err
}

// undo deletes l.Value's row of l.Key, live or expired, after an acquire
// whose outcome is unknown, and returns err joined with the delete's
// error.
func (m *MySQL) undo(ctx context.Context, l *backend.Lease, err error) error {
	cctx, cancel := cleanupContext(ctx)
	defer cancel()
	if cerr := m.deleteAny(cctx, l); cerr != nil {
		err = fmt.Errorf("%w (not cleaned up: %w)", err, cerr)
	}
	return err
}

// Release deletes l's row if l.Value still owns l.Key. It returns
// [backend.ErrNotHeld] when another owner holds the key, no row exists, or
// our row had expired; a stale row of ours is then deleted by a second
// statement (the common path is one statement). A deadlock or lock wait
// timeout reruns the statement, up to 5 times.
func (m *MySQL) Release(ctx context.Context, l *backend.Lease) error {
	if err := m.validate(l); err != nil {
		return err
	}
	if l.Kind != backend.KindMutex {
		live, err := m.groupRemove(ctx, m.kRel, m.kRelAny, l)
		switch {
		case err != nil:
			return fmt.Errorf("sqldb: mysql: release %q: %w", l.Key, err)
		case !live:
			return backend.ErrNotHeld
		}
		return nil
	}
	n, err := m.exec(ctx, m.rel, l.Key, l.Value)
	if err != nil {
		return fmt.Errorf("sqldb: mysql: release %q: %w", l.Key, err)
	}
	if n > 0 {
		return nil
	}
	if _, err := m.exec(ctx, m.relAny, l.Key, l.Value); err != nil {
		return fmt.Errorf("sqldb: mysql: release %q: delete expired row: %w", l.Key, err)
	}
	return backend.ErrNotHeld
}

// Refresh extends l by l.TTL from the database's current time if l.Value
// still owns l.Key and has not expired. It returns [backend.ErrNotHeld]
// otherwise. A deadlock or lock wait timeout reruns the statement, up to 5
// times.
func (m *MySQL) Refresh(ctx context.Context, l *backend.Lease) error {
	if err := m.validate(l); err != nil {
		return err
	}
	var n int64
	var err error
	if l.Kind == backend.KindMutex {
		n, err = m.exec(ctx, m.ref, micros(l.TTL), l.Key, l.Value)
	} else {
		n, err = m.exec(ctx, m.kRef.Stmt, m.kRef.args(kindVals(l, 0))...)
	}
	if err != nil {
		return fmt.Errorf("sqldb: mysql: refresh %q: %w", l.Key, err)
	}
	if n == 0 {
		return backend.ErrNotHeld
	}
	return nil
}

// exec runs st and returns the rows it affected, rerunning it after a
// deadlock or lock wait timeout (up to 5 times).
func (m *MySQL) exec(ctx context.Context, st *sql.Stmt, args ...any) (int64, error) {
	var n int64
	err := retryConflicts(myContention, func() error {
		res, err := st.ExecContext(ctx, args...)
		if err == nil {
			n, err = res.RowsAffected()
		}
		return err
	})
	return n, err
}

// Close closes the prepared statements. It does not close db.
func (m *MySQL) Close() error {
	var errs []error
	sts := []*sql.Stmt{m.acq, m.rel, m.relAny, m.ref, m.inspect, m.refAll, m.heldAll,
		m.kAcq, m.kRel.Stmt, m.kRelAny.Stmt, m.kWdr.Stmt, m.kWdrAny.Stmt, m.kGone.Stmt, m.kRef.Stmt, m.kInspect}
	sts = append(append(sts, m.acqBounded[:]...), m.kAcqBounded[:]...)
	for _, st := range sts {
		if st != nil {
			errs = append(errs, st.Close())
		}
	}
	return errors.Join(errs...)
}

// myContention reports whether err is a deadlock (1213) or lock wait
// timeout (1205): contention, retried by the spin loop.
func myContention(err error) bool {
	var me *mysql.MySQLError
	return errors.As(err, &me) && (me.Number == 1213 || me.Number == 1205)
}

// myLate reports whether err is MariaDB's max_statement_time cutting an
// acquire statement (ER_STATEMENT_TIMEOUT): nothing was written.
func myLate(err error) bool {
	var me *mysql.MySQLError
	return errors.As(err, &me) && me.Number == 1969
}

// myAmbiguous reports whether a failed statement may have committed: the
// server did not answer with an error, and the statement was sent. One
// that could not get a connection (the dial failed: refused, no route)
// was not: database/sql tries another connection only after the driver
// said the last one sent nothing (driver.ErrBadConn). (A cleanup after a
// request that was never sent costs one statement and deletes nothing.)
func myAmbiguous(err error) bool {
	var me *mysql.MySQLError
	var op *net.OpError
	return !errors.As(err, &me) && !(errors.As(err, &op) && op.Op == "dial")
}
