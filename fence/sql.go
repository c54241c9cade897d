package fence

import (
	"context"
	"database/sql"
	"fmt"
	"math"
	"regexp"
	"strconv"
	"strings"
	"unicode/utf8"

	"github.com/distlock/distlock/backend"
)

// DefaultTable is the usual name of the fence table.
const DefaultTable = "distlock_fence"

// MaxResourceLen is the longest resource name, in bytes, a fence table
// holds.
const MaxResourceLen = 255

// SQL is a fence table in PostgreSQL or MySQL/MariaDB: one row per
// resource, holding the highest token accepted for it. Its [SQL.Check]
// runs inside the caller's transaction, so the caller's other writes in
// that transaction commit only with an accepted token. A SQL is safe for
// concurrent use; it holds no connection.
//
// The table, made by [SQL.CreateTable] or ahead of time by its statement
// (here for [DefaultTable]):
//
//	-- PostgreSQL
//	CREATE TABLE IF NOT EXISTS distlock_fence (
//	  resource text COLLATE "C" PRIMARY KEY,
//	  token    bigint NOT NULL
//	);
//	-- MySQL, MariaDB
//	CREATE TABLE IF NOT EXISTS distlock_fence (
//	  resource VARBINARY(255) NOT NULL PRIMARY KEY,
//	  token    BIGINT UNSIGNED NOT NULL
//	) ENGINE=InnoDB;
//
// The application's role needs SELECT, INSERT and UPDATE on it. Rows are
// never deleted by this package: deleting a resource's row lets any token
// in again.
type SQL struct {
	table  string // as given
	mysql  bool
	create string
	check  string
}

// Postgres returns the fence table named table (for example
// [DefaultTable]) in PostgreSQL, for any database/sql driver (pgx's
// stdlib, lib/pq; sqldb.PostgresFence is the same table through pgx
// itself). The name is "table" or "schema.table", each part an identifier
// of ASCII letters, digits and underscores not starting with a digit, at
// most 63 bytes; it is quoted as given, so case-sensitive. Any other name
// is an error wrapping distlock.ErrInvalid. Postgres does no I/O.
//
// PostgreSQL stores tokens as bigint: a token above math.MaxInt64 is bad
// input (no distlock store hands one out).
func Postgres(table string) (*SQL, error) {
	q, err := quoteTable(table, `"`)
	if err != nil {
		return nil, err
	}
	return &SQL{
		table: table,
		create: `CREATE TABLE IF NOT EXISTS ` + q + ` (
  resource text COLLATE "C" PRIMARY KEY,
  token    bigint NOT NULL
)`,
		// One statement, one round trip: the upsert locks the
		// resource's row until the transaction ends, so that checks of
		// one resource take turns, and returns the highest token.
		check: `INSERT INTO ` + q + ` AS f (resource, token) VALUES ($1, $2)
ON CONFLICT (resource) DO UPDATE SET token = greatest(f.token, excluded.token)
RETURNING token`,
	}, nil
}

// MySQL returns the fence table named table (for example [DefaultTable])
// in MySQL or MariaDB, for github.com/go-sql-driver/mysql or any driver
// that reports LAST_INSERT_ID() in its result. The name is "table" or
// "database.table", as for [Postgres]. MySQL does no I/O.
func MySQL(table string) (*SQL, error) {
	q, err := quoteTable(table, "`")
	if err != nil {
		return nil, err
	}
	return &SQL{
		table: table,
		mysql: true,
		create: `CREATE TABLE IF NOT EXISTS ` + q + ` (
  resource VARBINARY(255) NOT NULL PRIMARY KEY,
  token    BIGINT UNSIGNED NOT NULL
) ENGINE=InnoDB`,
		// The upsert locks the row until the transaction ends; the
		// highest token comes back in the OK packet's insert id (both
		// the insert and the update set LAST_INSERT_ID).
		check: `INSERT INTO ` + q + ` (resource, token) VALUES (?, LAST_INSERT_ID(?))
ON DUPLICATE KEY UPDATE token = LAST_INSERT_ID(GREATEST(token, VALUES(token)))`,
	}, nil
}

var identRE = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]{0,62}$`)

// quoteTable checks a "table" or "schema.table" name and quotes each part
// with q.
func quoteTable(table, q string) (string, error) {
	parts := strings.Split(table, ".")
	if len(parts) > 2 {
		return "", fmt.Errorf("fence: table name %s: want table or schema.table: %w", strconv.Quote(table), backend.ErrInvalid)
	}
	for i, p := range parts {
		if !identRE.MatchString(p) {
			return "", fmt.Errorf("fence: table name %s: %s is not an identifier ([A-Za-z_][A-Za-z0-9_]*, at most 63 bytes): %w",
				strconv.Quote(table), strconv.Quote(p), backend.ErrInvalid)
		}
		parts[i] = q + p + q
	}
	return strings.Join(parts, "."), nil
}

func (s *SQL) dialect() string {
	if s.mysql {
		return "mysql"
	}
	return "postgres"
}

// CreateTable creates the table if it does not exist (the statement in
// the type's documentation, with the table's name).
func (s *SQL) CreateTable(ctx context.Context, db *sql.DB) error {
	if ctx == nil || db == nil {
		return fmt.Errorf("fence: %s: CreateTable with a nil context or DB: %w", s.dialect(), backend.ErrInvalid)
	}
	if _, err := db.ExecContext(ctx, s.create); err != nil {
		return fmt.Errorf("fence: %s: create table %s: %w", s.dialect(), s.table, err)
	}
	return nil
}

// Check accepts token for resource inside tx: when token is not below the
// highest token accepted for resource by a committed transaction (an
// equal one passes: the same holder writing again), it makes token the
// highest, to commit with tx, and returns nil; otherwise it returns a
// [*StaleError] and changes nothing. Roll tx back then: its other writes
// are a stale holder's. Tokens of different resources are never
// compared, and tokens of different locks do not compare: fence one
// resource with one lock key.
//
// Check locks the resource's row until tx ends, so that the transactions
// writing one resource take turns: call it first in tx, before the writes
// it guards (that also keeps writers from deadlocking on their other
// rows). A holder paused inside its transaction (a GC pause, a stopped
// process: the case fencing is for) therefore keeps the next holder's
// write waiting until the database ends that transaction: bound the
// transactions that wait for their client on the resource's database
// (PostgreSQL's idle_in_transaction_session_timeout, MySQL's
// wait_timeout), and the paused holder's transaction is rolled back,
// having written nothing.
//
// In REPEATABLE READ or SERIALIZABLE transactions a concurrent check of
// the same resource may fail with the database's serialization error;
// like a deadlock, it is returned wrapped: run the transaction again.
//
// Bad input, returned before any I/O as an error wrapping
// distlock.ErrInvalid: a nil ctx or tx, an empty resource, one longer
// than [MaxResourceLen] bytes (on PostgreSQL also one that is not UTF-8
// text without NUL), token 0, on PostgreSQL a token above math.MaxInt64.
// Any other error is the database's, wrapped with the resource.
func (s *SQL) Check(ctx context.Context, tx *sql.Tx, resource string, token uint64) error {
	if err := Validate(resource, token); err != nil {
		return err
	}
	if err := s.validate(resource, token); err != nil {
		return err
	}
	if ctx == nil || tx == nil {
		return fmt.Errorf("fence: %s: check %s with a nil context or transaction: %w", s.dialect(), strconv.Quote(resource), backend.ErrInvalid)
	}
	var highest uint64
	if s.mysql {
		res, err := tx.ExecContext(ctx, s.check, resource, token)
		if err != nil {
			return fmt.Errorf("fence: mysql: check %s: %w", strconv.Quote(resource), err)
		}
		id, err := res.LastInsertId()
		if err != nil {
			return fmt.Errorf("fence: mysql: check %s: %w", strconv.Quote(resource), err)
		}
		highest = uint64(id) // BIGINT UNSIGNED, sent as int64's bits
	} else {
		var h int64
		if err := tx.QueryRowContext(ctx, s.check, resource, int64(token)).Scan(&h); err != nil {
			return fmt.Errorf("fence: postgres: check %s: %w", strconv.Quote(resource), err)
		}
		highest = uint64(h)
	}
	switch {
	case highest == token:
		return nil
	case highest > token:
		return &StaleError{Resource: resource, Token: token, Highest: highest}
	}
	return fmt.Errorf("fence: %s: check %s: the statement returned %d, below the token %d (does the driver report LAST_INSERT_ID?)",
		s.dialect(), strconv.Quote(resource), highest, token)
}

// validate checks what the table's columns hold.
func (s *SQL) validate(resource string, token uint64) error {
	if len(resource) > MaxResourceLen {
		return fmt.Errorf("fence: %s: resource %s... is %d bytes long; the table holds at most %d: %w",
			s.dialect(), strconv.Quote(resource[:40]), len(resource), MaxResourceLen, backend.ErrInvalid)
	}
	if s.mysql {
		return nil
	}
	if !utf8.ValidString(resource) || strings.IndexByte(resource, 0) >= 0 {
		return fmt.Errorf("fence: postgres: resource %s is not UTF-8 text without NUL: %w", strconv.Quote(resource), backend.ErrInvalid)
	}
	if token > math.MaxInt64 {
		return fmt.Errorf("fence: postgres: %s: token %d is above bigint's range: %w", strconv.Quote(resource), token, backend.ErrInvalid)
	}
	return nil
}
