package sqldb

import (
	"context"
	"fmt"
	"math"
	"strconv"
	"strings"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/distlock/distlock/backend"
	"github.com/distlock/distlock/fence"
)

// PostgresFence is fence.Postgres's fence table through pgx: the same
// table, statement and rules (see [fence.SQL]), for a pgx.Tx. A
// PostgresFence is safe for concurrent use; it holds no connection.
type PostgresFence struct {
	table  string // as given
	create string
	check  string
}

// NewPostgresFence returns the fence table named table (for example
// fence.DefaultTable), "table" or "schema.table" as [WithTable] takes it;
// any other name is an error wrapping distlock.ErrInvalid. It does no
// I/O: create the table with [PostgresFence.CreateTable], or ahead of time
// with the statement in [fence.SQL]'s documentation.
func NewPostgresFence(table string) (*PostgresFence, error) {
	c, err := buildConfig("NewPostgresFence", []Option{WithTable(table)})
	if err != nil {
		return nil, err
	}
	q := pgx.Identifier(c.table).Sanitize()
	return &PostgresFence{
		table: table,
		// The statements of fence.Postgres: keep them the same
		// (TestPostgresFence checks that the two share a table).
		create: `CREATE TABLE IF NOT EXISTS ` + q + ` (
  resource text COLLATE "C" PRIMARY KEY,
  token    bigint NOT NULL
)`,
		check: `INSERT INTO ` + q + ` AS f (resource, token) VALUES ($1, $2)
ON CONFLICT (resource) DO UPDATE SET token = greatest(f.token, excluded.token)
RETURNING token`,
	}, nil
}

// CreateTable creates the table if it does not exist.
func (f *PostgresFence) CreateTable(ctx context.Context, pool *pgxpool.Pool) error {
	if ctx == nil || pool == nil {
		return fmt.Errorf("sqldb: fence: CreateTable with a nil context or pool: %w", backend.ErrInvalid)
	}
	if _, err := pool.Exec(ctx, f.create); err != nil {
		return fmt.Errorf("sqldb: fence: create table %s: %w", f.table, err)
	}
	return nil
}

// Check is [fence.SQL.Check] inside a pgx transaction: it accepts token
// for resource when it is not below the highest accepted by a committed
// transaction (equal passes), making it the highest with tx, and returns
// a *fence.StaleError (errors.Is(err, fence.ErrStale)) otherwise,
// changing nothing: roll tx back then. It locks the resource's row until
// tx ends: call it first in tx. Bad input, an error wrapping
// distlock.ErrInvalid before any I/O: a nil ctx or tx, an empty resource,
// one over fence.MaxResourceLen bytes or not UTF-8 text without NUL,
// token 0 or above math.MaxInt64. Any other error is the database's,
// wrapped with the resource (a serialization failure or deadlock: run
// the transaction again).
func (f *PostgresFence) Check(ctx context.Context, tx pgx.Tx, resource string, token uint64) error {
	if err := fence.Validate(resource, token); err != nil {
		return err
	}
	q := strconv.Quote(resource)
	switch {
	case len(resource) > fence.MaxResourceLen:
		return fmt.Errorf("sqldb: fence: resource %s is %d bytes long; the table holds at most %d: %w",
			shortQuote(resource), len(resource), fence.MaxResourceLen, backend.ErrInvalid)
	case !utf8.ValidString(resource) || strings.IndexByte(resource, 0) >= 0:
		return fmt.Errorf("sqldb: fence: resource %s is not UTF-8 text without NUL: %w", q, backend.ErrInvalid)
	case token > math.MaxInt64:
		return fmt.Errorf("sqldb: fence: %s: token %d is above bigint's range: %w", q, token, backend.ErrInvalid)
	case ctx == nil || tx == nil:
		return fmt.Errorf("sqldb: fence: check %s with a nil context or transaction: %w", q, backend.ErrInvalid)
	}
	var highest int64
	if err := tx.QueryRow(ctx, f.check, resource, int64(token)).Scan(&highest); err != nil {
		return fmt.Errorf("sqldb: fence: check %s: %w", q, err)
	}
	if uint64(highest) > token {
		return &fence.StaleError{Resource: resource, Token: token, Highest: uint64(highest)}
	}
	return nil
}
