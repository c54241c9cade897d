package sqldb

import (
	"context"
	"errors"
	"fmt"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"
	"github.com/jackc/pgx/v5/pgconn"
)

func TestValidateKey(t *testing.T) {
	tests := []struct {
		key   string
		chars bool // valid for a PostgreSQL varchar(255) column
		bytes bool // valid for a MySQL VARBINARY(255) column
	}{
		{"", false, false},
		{"a", true, true},
		{strings.Repeat("k", 255), true, true},
		{strings.Repeat("k", 256), false, false},
		{strings.Repeat("鍵", 255), true, false}, // 255 characters, 765 bytes
		{strings.Repeat("鍵", 85), true, true},   // 255 bytes
		{strings.Repeat("鍵", 86), true, false},  // 258 bytes
		{"a\x00b", false, true},
		{"\xff\xfe", false, true},
	}
	for _, tt := range tests {
		if err := validateKey(tt.key, unitChars); (err == nil) != tt.chars {
			t.Errorf("validateKey(%.20q, chars) = %v; want ok = %v", tt.key, err, tt.chars)
		}
		if err := validateKey(tt.key, unitBytes); (err == nil) != tt.bytes {
			t.Errorf("validateKey(%.20q, bytes) = %v; want ok = %v", tt.key, err, tt.bytes)
		}
	}
	err := validateKey(strings.Repeat("k", 300), unitChars)
	if err == nil || !strings.Contains(err.Error(), "300 characters") || !strings.Contains(err.Error(), "at most 255") {
		t.Errorf("error for a long key = %v; want it to give the length and the limit", err)
	}
}

// TestMySQLReservedKeys: keys that start like a fencing counter's are
// refused; a key merely starting with a NUL byte is not.
func TestMySQLReservedKeys(t *testing.T) {
	m := &MySQL{}
	for _, tt := range []struct {
		key string
		ok  bool
	}{
		{counterKey("k"), false},
		{counterPrefix, false},
		{counterPrefix + "x", false},
		{"\x00distlock:token", true},
		{"\x00k", true},
		{"distlock:token:1", true},
	} {
		err := m.ValidateKey(tt.key)
		if (err == nil) != tt.ok {
			t.Errorf("ValidateKey(%q) = %v; want ok = %v", tt.key, err, tt.ok)
		}
		if err != nil && !strings.HasPrefix(err.Error(), "sqldb: key") {
			t.Errorf("ValidateKey(%q) = %v; want a key error", tt.key, err)
		}
	}
	if !strings.HasPrefix(counterKey("k"), counterPrefix) {
		t.Errorf("counterKey(%q) = %q; want it under %q", "k", counterKey("k"), counterPrefix)
	}
}

func TestWithTable(t *testing.T) {
	tests := []struct {
		name string
		ok   bool
	}{
		{"locks", true},
		{"app.locks", true},
		{"_L0cks", true},
		{"", false},
		{"a.b.c", false},
		{"1locks", false},
		{"locks; DROP TABLE x", false},
		{`lo"cks`, false},
		{"lo`cks", false},
		{strings.Repeat("t", 53), true},
		{strings.Repeat("t", 54), false},
	}
	for _, tt := range tests {
		_, err := buildConfig([]Option{WithTable(tt.name)})
		if (err == nil) != tt.ok {
			t.Errorf("WithTable(%q) = %v; want ok = %v", tt.name, err, tt.ok)
		}
	}
	if _, err := buildConfig([]Option{nil}); err == nil {
		t.Errorf("a nil Option was accepted")
	}
}

func TestConstructorsRejectBadInputWithoutIO(t *testing.T) {
	ctx := context.Background()
	if _, err := NewPostgres(ctx, nil); err == nil {
		t.Errorf("NewPostgres(nil pool) = nil error")
	}
	if _, err := NewMySQL(ctx, nil); err == nil {
		t.Errorf("NewMySQL(nil db) = nil error")
	}
}

func TestMicros(t *testing.T) {
	tests := []struct {
		d    time.Duration
		want int64
	}{
		{time.Nanosecond, 1},
		{time.Microsecond, 1},
		{time.Microsecond + 1, 2},
		{300 * time.Millisecond, 300000},
		{math.MaxInt64, math.MaxInt64/1000 + 1},
	}
	for _, tt := range tests {
		if got := micros(tt.d); got != tt.want {
			t.Errorf("micros(%v) = %d; want %d", tt.d, got, tt.want)
		}
	}
}

func TestErrorClasses(t *testing.T) {
	wrap := func(err error) error { return fmt.Errorf("exec: %w", err) }
	pg := func(code string) error { return wrap(&pgconn.PgError{Code: code}) }
	my := func(n uint16) error { return wrap(&mysql.MySQLError{Number: n}) }
	tests := []struct {
		err                   error
		contention, ambiguous bool
	}{
		{pg("40001"), true, false},
		{pg("40P01"), true, false},
		{pg("55P03"), true, false},
		{pg("23505"), false, false},
		{pg("57014"), false, false},
		{wrap(context.Canceled), false, true}, // pgx's error for a cancel mid-request
		{wrap(&pgconn.ConnectError{}), false, false},
		{wrap(errors.New("read tcp: connection reset")), false, true},
	}
	for _, tt := range tests {
		if got := pgContention(tt.err); got != tt.contention {
			t.Errorf("pgContention(%v) = %v; want %v", tt.err, got, tt.contention)
		}
		if got := pgAmbiguous(tt.err); got != tt.ambiguous {
			t.Errorf("pgAmbiguous(%v) = %v; want %v", tt.err, got, tt.ambiguous)
		}
	}
	mtests := []struct {
		err                   error
		contention, ambiguous bool
	}{
		{my(1213), true, false},
		{my(1205), true, false},
		{my(1062), false, false},
		{wrap(mysql.ErrInvalidConn), false, true},
		{wrap(context.DeadlineExceeded), false, true},
	}
	for _, tt := range mtests {
		if got := myContention(tt.err); got != tt.contention {
			t.Errorf("myContention(%v) = %v; want %v", tt.err, got, tt.contention)
		}
		if got := myAmbiguous(tt.err); got != tt.ambiguous {
			t.Errorf("myAmbiguous(%v) = %v; want %v", tt.err, got, tt.ambiguous)
		}
	}
}

func TestRetryConflicts(t *testing.T) {
	conflict := &pgconn.PgError{Code: "40001"}
	other := errors.New("boom")
	tests := []struct {
		name      string
		errs      []error // returned by successive calls; nil after the end
		wantCalls int
		wantErr   error
	}{
		{"success", nil, 1, nil},
		{"conflict then success", []error{conflict, conflict}, 3, nil},
		{"other error is not retried", []error{other}, 1, other},
		{"gives up after 5 conflicts", []error{conflict, conflict, conflict, conflict, conflict, conflict}, 5, conflict},
	}
	for _, tt := range tests {
		calls := 0
		err := retryConflicts(pgContention, func() error {
			calls++
			if calls <= len(tt.errs) {
				return tt.errs[calls-1]
			}
			return nil
		})
		if calls != tt.wantCalls || !errors.Is(err, tt.wantErr) {
			t.Errorf("%s: %d calls, err %v; want %d calls, err %v", tt.name, calls, err, tt.wantCalls, tt.wantErr)
		}
	}
}

func TestStatementContext(t *testing.T) {
	if ctx := context.Background(); func() context.Context { s, stop := statementContext(ctx); stop(); return s }() != ctx {
		t.Errorf("statementContext(Background) is a new context; want Background itself")
	}
	type key struct{}
	ctx, cancel := context.WithCancel(context.WithValue(context.Background(), key{}, "v"))
	sctx, stop := statementContext(ctx)
	cancel()
	if sctx.Value(key{}) != "v" {
		t.Errorf("the statement's context lost ctx's values")
	}
	if err := sctx.Err(); err != nil {
		t.Errorf("the statement's context ended with ctx (%v); want it to outlive ctx", err)
	}
	stop()
	if sctx.Err() == nil {
		t.Errorf("the statement's context outlived stop")
	}
}
