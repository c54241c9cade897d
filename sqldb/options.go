package sqldb

import (
	"context"
	"errors"
	"fmt"
	"regexp"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/distlock/distlock/backend"
)

// DefaultTable is the table a backend uses unless [WithTable] says
// otherwise.
const DefaultTable = "distlock_locks"

// MaxKeyLen is the longest key the backends hold: 255 characters on
// PostgreSQL (varchar(255); a byte that is not valid UTF-8 counts as one
// character), 255 bytes on MySQL/MariaDB (VARBINARY(255)).
const MaxKeyLen = 255

// maxOwnerLen is the longest owner value the MySQL owner column
// (VARBINARY(255)) holds. PostgreSQL stores owners as text, without limit.
const maxOwnerLen = 255

// DefaultSetupTimeout bounds the I/O of [NewPostgres] and [NewMySQL]
// (connecting, checking and creating the table, preparing statements)
// when their context has no deadline: a database that accepts
// connections but does not answer fails the constructor after it, not
// never. A context with a deadline sets its own bound.
const DefaultSetupTimeout = 10 * time.Second

// setupTimeout is DefaultSetupTimeout; tests shorten it.
var setupTimeout = DefaultSetupTimeout

// errSetupTimeout is the cause of a setup context that ran out of
// setupTimeout.
var errSetupTimeout = errors.New("sqldb: setup timeout")

// setupContext returns ctx bounded by setupTimeout when it has no
// deadline.
func setupContext(ctx context.Context) (context.Context, context.CancelFunc) {
	if _, ok := ctx.Deadline(); ok {
		return context.WithCancel(ctx)
	}
	return context.WithTimeoutCause(ctx, setupTimeout, errSetupTimeout)
}

// setupError is err, the error of a constructor's I/O under ctx (from
// setupContext), saying so when the default bound cut it.
func setupError(ctx context.Context, err error) error {
	if err != nil && errors.Is(context.Cause(ctx), errSetupTimeout) {
		return fmt.Errorf("%w (no answer within %v: the default bound, DefaultSetupTimeout, for a context without a deadline)", err, setupTimeout)
	}
	return err
}

// Option configures [NewPostgres] and [NewMySQL].
type Option func(*config) error

type config struct {
	table []string // one or two parts: [schema.]table
}

func defaultConfig() config {
	return config{table: []string{DefaultTable}}
}

// maxTableLen leaves room for "_token_seq" within PostgreSQL's 63-byte
// identifiers.
const maxTableLen = 53

var identRE = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*$`)

// WithTable sets the table the locks live in, "table" or "schema.table"
// (on MySQL "database.table"); default [DefaultTable]. Each part must be
// an identifier made of ASCII letters, digits and underscores, not
// starting with a digit; the whole name at most 53 bytes (on PostgreSQL
// the sequence beside it is named table_token_seq, within the 63-byte
// identifier limit). The name is quoted as given, so it is case-sensitive
// on PostgreSQL, and resolved once by the constructor (see
// [NewPostgres]). Any other name makes the constructor return an error
// wrapping backend.ErrInvalid before any I/O.
func WithTable(name string) Option {
	return func(c *config) error {
		if len(name) > maxTableLen {
			return fmt.Errorf("table name %q is longer than %d bytes", name, maxTableLen)
		}
		parts := strings.Split(name, ".")
		if len(parts) > 2 {
			return fmt.Errorf("table name %q: want table or schema.table", name)
		}
		for _, p := range parts {
			if !identRE.MatchString(p) {
				return fmt.Errorf("table name %q: %q is not a plain identifier ([A-Za-z_][A-Za-z0-9_]*)", name, p)
			}
		}
		c.table = parts
		return nil
	}
}

// buildConfig applies opts for the constructor op; its errors wrap
// backend.ErrInvalid.
func buildConfig(op string, opts []Option) (config, error) {
	c := defaultConfig()
	for _, o := range opts {
		if o == nil {
			return c, fmt.Errorf("sqldb: %s: %w: nil Option", op, backend.ErrInvalid)
		}
		if err := o(&c); err != nil {
			return c, fmt.Errorf("sqldb: %s: %w: %w", op, backend.ErrInvalid, err)
		}
	}
	return c, nil
}

// tableName is the table name as the user wrote it ("schema.table").
func (c config) tableName() string {
	if len(c.table) == 2 {
		return c.table[0] + "." + c.table[1]
	}
	return c.table[0]
}

// keyUnit says how a backend's key column counts length.
type keyUnit int

const (
	unitChars keyUnit = iota // PostgreSQL varchar(n): characters
	unitBytes                // MySQL VARBINARY(n): bytes
)

// validateKey checks key against the lock_key column: non-empty and at
// most MaxKeyLen in the column's unit. It does no I/O.
func validateKey(key string, unit keyUnit) error {
	if key == "" {
		return errors.New("sqldb: empty key")
	}
	switch unit {
	case unitChars:
		// Any bytes: an invalid UTF-8 byte counts as one character.
		if n := utf8.RuneCountInString(key); n > MaxKeyLen {
			return fmt.Errorf("sqldb: key %s is %d characters long; the lock_key column holds at most %d", shortQuote(key), n, MaxKeyLen)
		}
	case unitBytes:
		if len(key) > MaxKeyLen {
			return fmt.Errorf("sqldb: key %s is %d bytes long; the lock_key column holds at most %d", shortQuote(key), len(key), MaxKeyLen)
		}
	}
	return nil
}

// shortQuote quotes a key for an error message, eliding the middle of a
// long one.
func shortQuote(s string) string {
	const max = 40
	if len(s) <= max {
		return fmt.Sprintf("%q", s)
	}
	return fmt.Sprintf("%q...", s[:max])
}

// micros rounds a TTL up to whole microseconds, the resolution both
// databases keep timestamps in, so a lease is never shorter than asked.
func micros(d time.Duration) int64 {
	us := int64(d / time.Microsecond) // d+1µs-1 would wrap negative near math.MaxInt64
	if d%time.Microsecond > 0 {
		us++
	}
	if us < 1 {
		us = 1
	}
	return us
}

// conflictRetries bounds how often Release and Refresh rerun a statement
// that the database rolled back for a serialization failure or deadlock.
const conflictRetries = 5

// retryConflicts runs fn until it succeeds, fails with an error that
// conflict does not match, or has failed conflictRetries times. Under
// REPEATABLE READ or SERIALIZABLE sessions a release can collide with a
// contender that marked the row a moment earlier; the remedy the
// databases document is to run the transaction again, and these are
// single statements, so a rerun is immediate and safe.
func retryConflicts(conflict func(error) bool, fn func() error) error {
	var err error
	for range conflictRetries {
		if err = fn(); err == nil || !conflict(err) {
			return err
		}
	}
	return err
}
