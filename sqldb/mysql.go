package sqldb

import (
	"context"
	"database/sql"
	"encoding/hex"
	"errors"
	"fmt"
	"hash/crc32"
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

	acq, rel, relAny, ref *sql.Stmt
}

// NewMySQL returns a lock backend over db, creating the lock table and its
// fencing counter row if absent. Any DSN works (parseTime is not needed:
// times are computed in SQL and never scanned). The caller owns db:
// [MySQL.Close] closes only the prepared statements. Options: [WithTable].
//
// It returns an error for a nil db or a bad option (before any I/O), and
// the database's error, wrapped, when the table cannot be checked or
// created or the statements cannot be prepared.
func NewMySQL(ctx context.Context, db *sql.DB, opts ...Option) (*MySQL, error) {
	if db == nil {
		return nil, errors.New("sqldb: NewMySQL: nil db")
	}
	c, err := buildConfig(opts)
	if err != nil {
		return nil, err
	}
	q := "`" + strings.Join(c.table, "`.`") + "`"
	m := &MySQL{db: db, table: c.tableName()}
	if err := m.createTable(ctx, q); err != nil {
		return nil, err
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
	m.acq = prep(`INSERT INTO ` + q + ` (lock_key, owner, token, expires_at) VALUES
  (?, '', LAST_INSERT_ID(TIMESTAMPDIFF(MICROSECOND, '1970-01-01', UTC_TIMESTAMP(6))), '9999-12-31 23:59:59'),
  (?, ?, LAST_INSERT_ID(), UTC_TIMESTAMP(6) + INTERVAL ? MICROSECOND)
ON DUPLICATE KEY UPDATE
  owner = IF(` + isCounter + ` OR expires_at > UTC_TIMESTAMP(6), owner, ?),
  token = IF(` + isCounter + `, LAST_INSERT_ID(token + 1),
          IF(expires_at > UTC_TIMESTAMP(6),
             token + 0 * LAST_INSERT_ID(9223372036854775808 | TIMESTAMPDIFF(MICROSECOND, UTC_TIMESTAMP(6), expires_at)),
             LAST_INSERT_ID())),
  expires_at = IF(` + isCounter + ` OR expires_at > UTC_TIMESTAMP(6), expires_at,
                  UTC_TIMESTAMP(6) + INTERVAL ? MICROSECOND)`)
	m.rel = prep(`DELETE FROM ` + q + ` WHERE lock_key = ? AND owner = ? AND expires_at > UTC_TIMESTAMP(6)`)
	m.relAny = prep(`DELETE FROM ` + q + ` WHERE lock_key = ? AND owner = ?`)
	m.ref = prep(`UPDATE ` + q + ` SET expires_at = UTC_TIMESTAMP(6) + INTERVAL ? MICROSECOND
WHERE lock_key = ? AND owner = ? AND expires_at > UTC_TIMESTAMP(6)`)
	if err != nil {
		m.Close()
		return nil, fmt.Errorf("sqldb: mysql: prepare statements for %s: %w", m.table, err)
	}
	return m, nil
}

func (m *MySQL) createTable(ctx context.Context, q string) error {
	// A query, not Exec: go-sql-driver v1.10 hangs when a SELECT goes
	// through Exec on a server-side prepared statement, which is what
	// database/sql does for connectors without ExecerContext (wrappers
	// for tracing, say).
	rows, err := m.db.QueryContext(ctx, `SELECT 1 FROM `+q+` LIMIT 0`)
	if err == nil {
		err = rows.Close()
	}
	var me *mysql.MySQLError
	switch {
	case err == nil:
		// exists: an existing table needs no CREATE privilege
	case errors.As(err, &me) && me.Number == 1146: // ER_NO_SUCH_TABLE
		_, err = m.db.ExecContext(ctx, `CREATE TABLE IF NOT EXISTS `+q+` (
  lock_key   VARBINARY(255) NOT NULL PRIMARY KEY,
  owner      VARBINARY(255) NOT NULL,
  token      BIGINT UNSIGNED NOT NULL,
  expires_at DATETIME(6) NOT NULL
) ENGINE=InnoDB`)
		if err != nil {
			return fmt.Errorf("sqldb: mysql: create table %s: %w", m.table, err)
		}
	default:
		return fmt.Errorf("sqldb: mysql: check table %s: %w", m.table, err)
	}
	// The fencing counter rows come with the first acquire of a key in
	// their bucket. (Tables made before them hold one counter row, key '',
	// that this version neither reads nor deletes.)
	return nil
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
// counter row (one of 1024 in the table, chosen by a hash of the key). When a live owner holds the key it returns acquired ==
// false, a nil error and the holder's remaining time as holderTTL. A
// deadlock or lock wait timeout (errors 1213, 1205) is also reported as
// acquired == false with a nil error: it is contention, and the facade's
// spin loop retries.
//
// The statement is not abandoned when ctx ends: it runs on until its reply
// comes (at most 5s more), and if it took the key after all, TryAcquire
// deletes the row again and returns ctx's error. When the outcome stays
// unknown (the connection failed, or no reply came within those 5s) it
// deletes l.Value's row, if any, before returning the error; that delete
// may come too early for a statement the server has yet to finish. (With
// SetMaxOpenConns, a wait for a free connection also runs on past ctx's
// end: database/sql has no way to prepare once per connection and pick the
// connection first.) An owner value over 255 bytes is an error, without
// I/O.
func (m *MySQL) TryAcquire(ctx context.Context, l *backend.Lease) (bool, time.Duration, error) {
	if err := m.validate(l); err != nil {
		return false, 0, err
	}
	ttl := micros(l.TTL)
	sctx, stop := statementContext(ctx)
	res, err := m.acq.ExecContext(sctx, counterKey(l.Key), l.Key, l.Value, ttl, l.Value, ttl)
	stop()
	var id int64
	if err == nil {
		id, err = res.LastInsertId()
	}
	if err != nil {
		if myContention(err) {
			return false, 0, nil
		}
		if myAmbiguous(err) {
			err = m.undo(ctx, l, err)
		}
		return false, 0, fmt.Errorf("sqldb: mysql: acquire %q: %w", l.Key, err)
	}
	u := uint64(id)
	if u&contendedBit != 0 {
		return false, time.Duration(u&^contendedBit) * time.Microsecond, nil
	}
	if u == 0 {
		return false, 0, fmt.Errorf("sqldb: mysql: acquire %q: the statement returned no token (is the driver passing LAST_INSERT_ID through?)", l.Key)
	}
	if err := ctx.Err(); err != nil {
		// The caller gave up before the reply came: undo, in order
		// after the statement, which has committed.
		return false, 0, fmt.Errorf("sqldb: mysql: acquire %q: %w", l.Key, m.undo(ctx, l, err))
	}
	l.Token = u
	return true, 0, nil
}

// undo deletes l.Value's row of l.Key, live or expired, after a failed or
// abandoned acquire, and returns err joined with the delete's error.
func (m *MySQL) undo(ctx context.Context, l *backend.Lease, err error) error {
	cctx, cancel := cleanupContext(ctx)
	defer cancel()
	if _, cerr := m.exec(cctx, m.relAny, l.Key, l.Value); cerr != nil {
		err = errors.Join(err, fmt.Errorf("cleanup: %w", cerr))
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
	n, err := m.exec(ctx, m.ref, micros(l.TTL), l.Key, l.Value)
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
	for _, st := range []*sql.Stmt{m.acq, m.rel, m.relAny, m.ref} {
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

// myAmbiguous reports whether a failed statement may have committed: the
// server did not answer with an error. (A cleanup after a request that
// was never sent costs one statement and deletes nothing.)
func myAmbiguous(err error) bool {
	var me *mysql.MySQLError
	return !errors.As(err, &me)
}
