package sqldb

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"net"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/distlock/distlock/backend"
)

func TestValidateKey(t *testing.T) {
	tests := []struct {
		key   string
		chars bool // valid for PostgreSQL: at most 255 characters
		bytes bool // valid for a MySQL VARBINARY(255) column
	}{
		{"", false, false},
		{"a", true, true},
		{strings.Repeat("k", 255), true, true},
		{strings.Repeat("k", 256), false, false},
		{strings.Repeat("鍵", 255), true, false}, // 255 characters, 765 bytes
		{strings.Repeat("鍵", 85), true, true},   // 255 bytes
		{strings.Repeat("鍵", 86), true, false},  // 258 bytes
		{"a\x00b", true, true},                  // PostgreSQL: in the kinds table, keyed by bytes
		{"\xff\xfe", true, true},                // an invalid byte counts as one character
		{strings.Repeat("\xff", 255), true, true},
		{strings.Repeat("\xff", 256), false, false},
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
		_, err := buildConfig("NewX", []Option{WithTable(tt.name)})
		if (err == nil) != tt.ok || (err != nil && !errors.Is(err, backend.ErrInvalid)) {
			t.Errorf("WithTable(%q) = %v; want ok = %v, or an ErrInvalid error", tt.name, err, tt.ok)
		}
	}
	if _, err := buildConfig("NewX", []Option{nil}); !errors.Is(err, backend.ErrInvalid) {
		t.Errorf("a nil Option: %v; want an ErrInvalid error", err)
	}
}

func TestConstructorsRejectBadInputWithoutIO(t *testing.T) {
	ctx := context.Background()
	// Over a pool and a db whose server does not exist: any I/O would
	// fail with another error, or hang.
	pool, err := pgxpool.New(ctx, "postgres://u@127.0.0.1:1/db")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	db, err := sql.Open("mysql", "u@tcp(127.0.0.1:1)/db")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = db.Close() })
	var nilCtx context.Context
	bad := WithTable("locks; DROP TABLE x")
	for _, tt := range []struct {
		name string
		err  error
	}{
		{"NewPostgres(nil ctx)", func() error { _, err := NewPostgres(nilCtx, pool); return err }()},
		{"NewPostgres(nil pool)", func() error { _, err := NewPostgres(ctx, nil); return err }()},
		{"NewPostgres(bad table)", func() error { _, err := NewPostgres(ctx, pool, bad); return err }()},
		{"NewPostgres(nil option)", func() error { _, err := NewPostgres(ctx, pool, nil); return err }()},
		{"NewMySQL(nil ctx)", func() error { _, err := NewMySQL(nilCtx, db); return err }()},
		{"NewMySQL(nil db)", func() error { _, err := NewMySQL(ctx, nil); return err }()},
		{"NewMySQL(bad table)", func() error { _, err := NewMySQL(ctx, db, bad); return err }()},
		{"NewMySQL(nil option)", func() error { _, err := NewMySQL(ctx, db, nil); return err }()},
	} {
		if !errors.Is(tt.err, backend.ErrInvalid) {
			t.Errorf("%s = %v; want an ErrInvalid error", tt.name, tt.err)
		}
	}
}

// TestConstructorsBoundedOnSilentServer checks that NewPostgres and
// NewMySQL, given a context without a deadline, give up a server that
// accepts connections but never answers after the default setup bound,
// and say so.
func TestConstructorsBoundedOnSilentServer(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var conns []net.Conn
	var mu sync.Mutex
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns = append(conns, c) // held open, never answered
			mu.Unlock()
		}
	}()
	t.Cleanup(func() {
		ln.Close()
		<-done
		mu.Lock()
		defer mu.Unlock()
		for _, c := range conns {
			c.Close()
		}
	})
	old := setupTimeout
	setupTimeout = 300 * time.Millisecond
	t.Cleanup(func() { setupTimeout = old })
	ctx := context.Background()
	addr := ln.Addr().String()

	pool, err := pgxpool.New(ctx, "postgres://u@"+addr+"/db?sslmode=disable")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	db, err := sql.Open("mysql", "u@tcp("+addr+")/db")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = db.Close() })
	for name, newRes := range map[string]func() error{
		"NewPostgres": func() error { _, err := NewPostgres(ctx, pool); return err },
		"NewMySQL":    func() error { _, err := NewMySQL(ctx, db); return err },
	} {
		errc := make(chan error, 1)
		go func() { errc <- newRes() }()
		select {
		case err := <-errc:
			if err == nil || !strings.Contains(err.Error(), "no answer within 300ms") {
				t.Errorf("%s on a silent server = %v; want an error naming the bound", name, err)
			}
		case <-time.After(10 * setupTimeout):
			t.Fatalf("%s on a silent server still running after %v (bound %v)", name, 10*setupTimeout, setupTimeout)
		}
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
		// The dial failed: nothing was sent.
		{wrap(&net.OpError{Op: "dial", Net: "tcp", Err: syscall.ECONNREFUSED}), false, false},
		{wrap(&net.OpError{Op: "read", Net: "tcp", Err: syscall.ECONNRESET}), false, true},
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

// TestFlightRace races a statement's reply against its caller's context
// at random moments, many times: exactly one of them wins, the
// connection is settled once and as the winner says (back to the pool
// only when the caller took the reply), and an abandoned flight's reply
// still reaches its clean-up.
func TestFlightRace(t *testing.T) {
	rng := rand.New(rand.NewPCG(26, 26))
	var took, gaveUp int
	for i := range 2000 {
		replyIn := time.Duration(rng.IntN(200)) * time.Microsecond
		cancelIn := time.Duration(rng.IntN(200)) * time.Microsecond
		f := newFlight[int](time.Second)
		var settles atomic.Int32
		var settledAbandoned atomic.Bool
		var prepared chan int // written by prepare, read by an abandoned settle (the race detector checks the order)
		go func() {
			time.Sleep(replyIn)
			f.finish(i, func(abandoned bool) {
				settles.Add(1)
				settledAbandoned.Store(abandoned)
				if abandoned && prepared == nil {
					t.Errorf("trial %d: settled as abandoned before prepare ran", i)
				}
			})
		}()
		ctx, cancel := context.WithTimeout(context.Background(), cancelIn)
		res, ok := f.wait(ctx, func() { prepared = make(chan int) })
		cancel()
		if ok {
			took++
			if res != i {
				t.Fatalf("trial %d: wait returned reply %d", i, res)
			}
			// The reply is taken only once its connection is settled.
			if settles.Load() != 1 || settledAbandoned.Load() {
				t.Fatalf("trial %d: reply taken with %d settles (abandoned %v); want 1, false", i, settles.Load(), settledAbandoned.Load())
			}
			continue
		}
		gaveUp++
		actx, acancel := context.WithTimeout(context.Background(), 10*time.Second)
		res, err := f.await(actx)
		acancel()
		if err != nil || res != i {
			t.Fatalf("trial %d: the clean-up got %d, %v; want reply %d", i, res, err, i)
		}
		if settles.Load() != 1 || !settledAbandoned.Load() {
			t.Fatalf("trial %d: abandoned flight settled %d times (abandoned %v); want once, true", i, settles.Load(), settledAbandoned.Load())
		}
	}
	if took == 0 || gaveUp == 0 {
		t.Errorf("replies taken %d, flights abandoned %d: the race was not run both ways", took, gaveUp)
	}
	// A clean-up whose context ends first says so.
	f := newFlight[int](0)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := f.await(ctx); !errors.Is(err, context.Canceled) {
		t.Errorf("await with an ended context = %v; want context.Canceled", err)
	}
	if got, want := f.replyBy().Sub(f.sent), maxStatementTime+replyGrace; got != want {
		t.Errorf("unbounded flight's reply awaited %v after it was sent; want %v", got, want)
	}
}

func TestStatementBound(t *testing.T) {
	if got := statementBound(context.Background()); got != maxStatementTime {
		t.Errorf("statementBound without a deadline = %v; want %v", got, maxStatementTime)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	if got := statementBound(ctx); got <= 0 || got > 300*time.Millisecond {
		t.Errorf("statementBound 300ms before the deadline = %v; want within (0, 300ms]", got)
	}
	ctx, cancel = context.WithTimeout(context.Background(), time.Hour)
	defer cancel()
	if got := statementBound(ctx); got != maxStatementTime {
		t.Errorf("statementBound an hour before the deadline = %v; want %v", got, maxStatementTime)
	}
	ctx, cancel = context.WithDeadline(context.Background(), time.Now().Add(-time.Second))
	defer cancel()
	if got := statementBound(ctx); got != time.Microsecond {
		t.Errorf("statementBound past the deadline = %v; want 1µs", got)
	}
}

func TestAcquireStmtRungs(t *testing.T) {
	m := &MySQL{acq: new(sql.Stmt)}
	if st, b := m.acquireStmt(time.Second); st != m.acq || b != 0 {
		t.Errorf("without bounded statements: got %p, %v; want the plain one, 0", st, b)
	}
	for i := range m.acqBounded {
		m.acqBounded[i] = new(sql.Stmt)
	}
	for _, tt := range []struct{ bound, want time.Duration }{
		{time.Microsecond, 250 * time.Millisecond},
		{250 * time.Millisecond, 250 * time.Millisecond},
		{300 * time.Millisecond, 500 * time.Millisecond},
		{1500 * time.Millisecond, 2 * time.Second},
		{maxStatementTime, maxStatementTime},
		{time.Hour, maxStatementTime},
	} {
		st, b := m.acquireStmt(tt.bound)
		if b != tt.want {
			t.Errorf("acquireStmt(%v) rung %v; want %v", tt.bound, b, tt.want)
		}
		if i := slices.Index(boundRungs[:], b); i < 0 || st != m.acqBounded[i] {
			t.Errorf("acquireStmt(%v) returned a statement not of rung %v", tt.bound, b)
		}
	}
}

// TestNotifyPayload: a key that is text is its own payload; another is
// sent in hex, and the listener wakes both readings of a payload that
// could be either.
func TestNotifyPayload(t *testing.T) {
	for _, key := range []string{"a", "ключ", `\x00`, "a\x00b", "\xff", "\x00"} {
		p := notifyPayload(key)
		if !textKey(p) {
			t.Errorf("notifyPayload(%q) = %q: not text", key, p)
		}
		k, alt, two := payloadKeys(p)
		if k != key && (!two || alt != key) {
			t.Errorf("payloadKeys(notifyPayload(%q)) = %q, %q, %v; want %q among them", key, k, alt, two, key)
		}
	}
	// A text key that reads as hex: both readings.
	if k, alt, two := payloadKeys(`\x00`); k != `\x00` || !two || alt != "\x00" {
		t.Errorf(`payloadKeys("\\x00") = %q, %q, %v; want both readings`, k, alt, two)
	}
}

// TestIntentLife: a waiter's intent lasts the lease's TTL, but ends
// headMargin before its acquisition's context does, and a waiter with
// less than headMargin left records none (0): a lock kept for a head
// with no time left to take it is lost to the whole line.
func TestIntentLife(t *testing.T) {
	within := func(ctxLeft time.Duration) context.Context {
		ctx, cancel := context.WithTimeout(context.Background(), ctxLeft)
		t.Cleanup(cancel)
		return ctx
	}
	if got := intentLife(context.Background(), time.Minute); got != time.Minute {
		t.Errorf("no deadline: %v; want the TTL, 1m", got)
	}
	if got := intentLife(within(time.Hour), time.Minute); got != time.Minute {
		t.Errorf("an hour left: %v; want the TTL, 1m", got)
	}
	if got := intentLife(within(time.Second), time.Minute); got > 950*time.Millisecond || got < 850*time.Millisecond {
		t.Errorf("1s left: %v; want 1s less the margin, 50ms", got)
	}
	if got := intentLife(within(25*time.Millisecond), time.Minute); got != 0 {
		t.Errorf("25ms left: %v; want 0, no intent (under the margin, 50ms)", got)
	}
}

// TestQueueLapse: acq's hint worked out from the row's queue, as the
// statement's RETURNING did: the holder's time, or the lapse of the last
// intent ahead when sooner; 0 when neither.
func TestQueueLapse(t *testing.T) {
	q := func(s string) []byte { return append([]byte{1}, s...) }
	line := q(`[{"o":"a","s":5,"e":1300},{"o":"me","s":7,"e":1900},{"o":"b","s":6,"e":1500},{"o":"c","s":9,"e":1100}]`)
	for _, c := range []struct {
		name   string
		holder int64
		queue  []byte
		owner  string
		want   int64
	}{
		{"held, nobody in line", 800, nil, "me", 800},
		{"free, nobody in line", -2, nil, "me", 0},
		{"free, two ahead: the later lapse", -2, line, "me", 500},
		{"held longer than the line ahead", 900, line, "me", 500},
		{"held shorter than the line ahead", 200, line, "me", 200},
		{"first in line", 300, line, "a", 300},
		{"not in line", 300, line, "z", 300},
		{"free and first in line", -2, line, "a", 0},
		{"empty line", 300, q(`[]`), "me", 300},
	} {
		got, err := queueLapse(c.holder, c.queue, c.owner, 1000)
		if err != nil || got != c.want {
			t.Errorf("%s: queueLapse = %d, %v; want %d", c.name, got, err, c.want)
		}
	}
	for _, bad := range [][]byte{append([]byte{2}, `[]`...), q(`[{"o":`)} {
		if _, err := queueLapse(0, bad, "me", 0); err == nil {
			t.Errorf("queueLapse(%q) = nil error; want one", bad)
		}
	}
}
