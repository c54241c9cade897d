package sqldb

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/distlock/distlock"
	"github.com/distlock/distlock/backend"
	"github.com/distlock/distlock/testsuite"
)

// tracer records every statement a pool sends, its arguments and its
// error.
type tracer struct {
	mu    sync.Mutex
	stmts []traced
}

type traced struct {
	sql  string
	args []any
	err  error
}

type traceKey struct{}

func (tr *tracer) TraceQueryStart(ctx context.Context, _ *pgx.Conn, d pgx.TraceQueryStartData) context.Context {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	tr.stmts = append(tr.stmts, traced{sql: d.SQL, args: d.Args})
	return context.WithValue(ctx, traceKey{}, len(tr.stmts)-1)
}

func (tr *tracer) TraceQueryEnd(ctx context.Context, _ *pgx.Conn, d pgx.TraceQueryEndData) {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	if i, ok := ctx.Value(traceKey{}).(int); ok {
		tr.stmts[i].err = d.Err
	}
}

func (tr *tracer) reset() []traced {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	s := tr.stmts
	tr.stmts = nil
	return s
}

func (tr *tracer) codes() map[string]int {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	m := map[string]int{}
	for _, s := range tr.stmts {
		var pe *pgconn.PgError
		if errors.As(s.err, &pe) {
			m[pe.Code]++
		}
	}
	return m
}

func tracedPool(tr *tracer, runtime map[string]string) func(*pgxpool.Config) {
	return func(c *pgxpool.Config) {
		c.ConnConfig.Tracer = tr
		for k, v := range runtime {
			c.ConnConfig.RuntimeParams[k] = v
		}
	}
}

// testNoClientTime checks the wire: each operation is one statement, and
// no statement carries a time from the client, only the key, the owner
// value, the TTL as a count of microseconds and the channel name.
func testNoClientTime(t *testing.T, pg *pgFixture) {
	tr := &tracer{}
	r := pg.resource(t, pg.pool(t, tracedPool(tr, nil)))
	key := testsuite.Key(t)
	l := newLease(t, key, 3*time.Second)
	tr.reset()
	l2 := newLease(t, key, 3*time.Second)
	ops := []struct {
		name  string
		do    func() error
		stmts int
	}{
		{"acquire", func() error { _, _, err := r.TryAcquire(t.Context(), l); return err }, 1},
		{"contended acquire", func() error {
			_, _, err := r.TryAcquire(t.Context(), newLease(t, key, time.Second))
			return err
		}, 1},
		{"refresh", func() error { return r.Refresh(t.Context(), l) }, 1},
		// A contender waited: the plain DELETE finds no row it may
		// delete, and the one that notifies follows.
		{"release", func() error { return r.Release(t.Context(), l) }, 2},
		{"acquire again", func() error { _, _, err := r.TryAcquire(t.Context(), l2); return err }, 1},
		{"uncontended release", func() error { return r.Release(t.Context(), l2) }, 1},
	}
	for _, op := range ops {
		if err := op.do(); err != nil {
			t.Fatalf("%s: %v", op.name, err)
		}
		stmts := tr.reset()
		if len(stmts) != op.stmts {
			t.Errorf("%s: %d statements; want %d", op.name, len(stmts), op.stmts)
		}
		for _, s := range stmts {
			for i, a := range s.args {
				switch a.(type) {
				case string, int64, bytesArg, bool:
				default:
					t.Errorf("%s: argument $%d is %T (%v); want only strings, byte strings, integers and booleans", op.name, i+1, a, a)
				}
			}
			if !strings.Contains(s.sql, "now()") && !strings.HasSuffix(op.name, "release") {
				t.Errorf("%s: %q does not use the server clock now()", op.name, s.sql)
			}
		}
	}
}

// waitLockWaiters polls until n sessions of the database wait on a lock.
func waitLockWaiters(t *testing.T, pg *pgFixture, n int) {
	t.Helper()
	eventually(t, 10*time.Second, "sessions waiting on a row lock", func() (bool, error) {
		var got int
		err := pg.admin.QueryRow(context.Background(),
			`SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND wait_event_type = 'Lock'`).Scan(&got)
		return got >= n, err
	})
}

// testReleaseRacingRefresh: a Release of a semaphore's permit
// whose snapshot sees the permit expired, while a Refresh that began
// before the expiry, and holds the row, commits a longer life: the
// release deletes the permit as the refresh left it (live), and must say
// so (nil), not ErrNotHeld: the statement must judge "live" by the
// version of the row it deletes, not by its snapshot's.
func testReleaseRacingRefresh(t *testing.T, pg *pgFixture) {
	ctx := t.Context()
	p := pg.resource(t, pg.pool(t, nil))
	key := testsuite.Key(t)
	l := newLease(t, key, time.Second)
	l.Kind, l.Limit = backend.KindSemaphore, 2
	mustAcquire(t, p, l)
	// The refresh, in a transaction left open: it holds the row's lock.
	tx, err := pg.admin.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(context.Background())
	tag, err := tx.Exec(ctx, p.kRef, bytesArg(l.Key), l.Value, groupRow(l.Kind), mode(l.Kind), micros(time.Minute))
	if err != nil || tag.RowsAffected() != 1 {
		t.Fatalf("the refresh = %v, %v; want one row", tag, err)
	}
	// The permit's first life ends, by the server's clock, as the
	// committed row has it.
	eventually(t, 10*time.Second, "the permit's first expiry", func() (bool, error) {
		var state []byte
		var lim int
		var now int64
		if err := pg.admin.QueryRow(ctx, p.kInspect, bytesArg(l.Key), groupRow(l.Kind)).Scan(&state, &lim, &now); err != nil {
			return false, err
		}
		var st struct {
			H []struct {
				E int64 `json:"e"`
			} `json:"h"`
		}
		if err := json.Unmarshal(state, &st); err != nil || len(st.H) != 1 {
			return false, fmt.Errorf("state %s: %v", state, err)
		}
		return now > st.H[0].E, nil
	})
	errc := make(chan error, 1)
	go func() { errc <- p.Release(context.Background(), l) }()
	waitLockWaiters(t, pg, 1)
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-errc; err != nil {
		t.Errorf("Release of a permit a committed refresh kept live = %v; want nil", err)
	}
	in, err := p.Inspect(ctx, key, backend.KindSemaphore)
	if err != nil || len(in.Holders) != 0 {
		t.Errorf("Inspect after the release = %+v, %v; want no holder", in, err)
	}
}

// testSerializationFailure makes the database raise a real serialization
// failure inside TryAcquire: a REPEATABLE READ session's upsert finds the
// row changed by a transaction its snapshot does not see. TryAcquire must
// report contention (false, nil), not an error, so the spin loop retries.
func testSerializationFailure(t *testing.T, pg *pgFixture) {
	tr := &tracer{}
	rr := pg.resource(t, pg.pool(t, tracedPool(tr, map[string]string{"default_transaction_isolation": "repeatable read"})))
	a := pg.resource(t, pg.pool(t, nil))
	key := testsuite.Key(t)
	la := newLease(t, key, time.Minute)
	mustAcquire(t, a, la)

	tx, err := pg.admin.Begin(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(context.Background())
	if _, err := tx.Exec(t.Context(), `UPDATE distlock_locks SET expires_at = now() - interval '1 second' WHERE lock_key = $1`, key); err != nil {
		t.Fatal(err)
	}
	type result struct {
		ok  bool
		err error
	}
	res := make(chan result, 1)
	lb := newLease(t, key, time.Minute)
	go func() {
		ok, _, err := rr.TryAcquire(t.Context(), lb)
		res <- result{ok, err}
	}()
	waitLockWaiters(t, pg, 1)
	if err := tx.Commit(t.Context()); err != nil {
		t.Fatal(err)
	}
	got := <-res
	if got.ok || got.err != nil {
		t.Fatalf("TryAcquire against a concurrent update = %v, %v; want false, nil (contention)", got.ok, got.err)
	}
	if n := tr.codes()["40001"]; n != 1 {
		t.Fatalf("the database raised %d serialization failures; want 1 (codes %v)", n, tr.codes())
	}
	// The retry the spin loop would make now succeeds: the row expired.
	mustAcquire(t, rr, lb)
	if err := rr.Release(t.Context(), lb); err != nil {
		t.Fatal(err)
	}
}

// testSerializableWorkload runs the concurrency workload over sessions in
// SERIALIZABLE isolation, where the database raises serialization failures
// under contention: callers must see none of them.
func testSerializableWorkload(t *testing.T, pg *pgFixture) {
	tr := &tracer{}
	testConcurrency(t, func(t testing.TB) resource {
		return pg.resource(t, pg.pool(t, tracedPool(tr, map[string]string{"default_transaction_isolation": "serializable"})))
	})
	t.Logf("serialization failures the database raised and the backend absorbed: %v", tr.codes())
}

// testNotify checks that a release wakes the subscribers of its key when a
// contender tried it meanwhile, that an uncontended release sends nothing,
// and that a waiter whose spin would sleep longer than its whole context is
// woken by the release notice and gets the lock.
func testNotify(t *testing.T, pg *pgFixture) {
	a := pg.resource(t, pg.pool(t, nil))
	b := pg.resource(t, pg.pool(t, nil))
	k1, k2, k3 := testsuite.Key(t), testsuite.Key(t), testsuite.Key(t)
	l1, l2, l3 := newLease(t, k1, time.Minute), newLease(t, k2, time.Minute), newLease(t, k3, time.Minute)
	for _, l := range []*backend.Lease{l1, l2, l3} {
		mustAcquire(t, a, l)
	}
	// b contends for k1 and k2, as the spin loop does before it subscribes.
	for _, k := range []string{k1, k2} {
		ok, holderTTL, err := b.TryAcquire(t.Context(), newLease(t, k, time.Minute))
		if ok || err != nil || holderTTL <= 0 || holderTTL > time.Minute {
			t.Fatalf("contended TryAcquire(%q) = %v, %v, %v; want false, the holder's time left, nil", k, ok, holderTTL, err)
		}
	}
	var chs [3]<-chan struct{}
	for i, k := range []string{k1, k2, k3} {
		ch, cancel := b.Subscribe(k)
		defer cancel()
		if ch == nil {
			t.Fatalf("Subscribe returned a nil channel")
		}
		chs[i] = ch
	}
	// The listener wakes everyone once it LISTENs (a release before that
	// was not heard); take that wake first.
	for _, ch := range chs {
		select {
		case <-ch:
		case <-time.After(10 * time.Second):
			t.Fatalf("no wake after the LISTEN connection came up")
		}
	}
	// k3 had no contender: its release notifies nobody. Notices arrive in
	// order on the one connection, so had it sent one, chs[2] would hold
	// it by the time k1's arrives.
	for _, l := range []*backend.Lease{l3, l1} {
		if err := a.Release(t.Context(), l); err != nil {
			t.Fatal(err)
		}
	}
	select {
	case <-chs[0]:
	case <-time.After(10 * time.Second):
		t.Fatalf("no notice for %q's release", k1)
	}
	for i, k := range []string{k2, k3} {
		select {
		case <-chs[i+1]:
			t.Fatalf("%q's subscriber woken (by %q's or %q's release)", k, k1, k3)
		default:
		}
	}
	if err := a.Release(t.Context(), l2); err != nil {
		t.Fatal(err)
	}
	select {
	case <-chs[1]:
	case <-time.After(10 * time.Second):
		t.Fatalf("no notice for %q's release", k2)
	}

	// Through the facade: spin sleeps of an hour, a context of 20s. Only a
	// release notice can let the waiter in before its context ends.
	mustAcquire(t, a, l1)
	d, err := distlock.New(b, distlock.WithSpin(time.Hour, time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	defer cancel()
	got := make(chan error, 1)
	go func() {
		lk, err := d.TryLock(ctx, k1, time.Hour)
		if err == nil {
			err = lk.Unlock(context.Background())
		}
		got <- err
	}()
	// Wait until the waiter subscribed and its connection listens.
	eventually(t, 10*time.Second, "waiter subscribed", func() (bool, error) {
		b.ln.mu.Lock()
		defer b.ln.mu.Unlock()
		return b.ln.n == 4 && b.ln.conns >= 1, nil
	})
	if err := a.Release(t.Context(), l1); err != nil {
		t.Fatal(err)
	}
	if err := <-got; err != nil {
		t.Fatalf("waiter: %v; want the lock, woken by the release notice", err)
	}
}

// testListenLifecycle checks that the LISTEN connection exists only while
// the resource has subscribers (plus the idle grace), and that Close ends
// it.
func testListenLifecycle(t *testing.T, pg *pgFixture) {
	app := "listen-" + testsuite.Key(t)[len(t.Name())+1:]
	r := pg.resource(t, pg.pool(t, func(c *pgxpool.Config) {
		c.ConnConfig.RuntimeParams["application_name"] = app
	}))
	r.ln.idle = 50 * time.Millisecond
	listening := func(want int) func() (bool, error) {
		return func() (bool, error) {
			var n int
			err := pg.admin.QueryRow(context.Background(),
				`SELECT count(*) FROM pg_stat_activity WHERE application_name = $1 AND query LIKE 'LISTEN %'`, app).Scan(&n)
			return n == want, err
		}
	}
	if ok, err := listening(0)(); !ok || err != nil {
		t.Fatalf("a LISTEN connection before any subscription (err %v)", err)
	}
	_, c1 := r.Subscribe("a")
	_, c2 := r.Subscribe("b")
	eventually(t, 10*time.Second, "one LISTEN connection while subscribed", listening(1))
	c1()
	c1() // a second call is harmless
	c2()
	eventually(t, 10*time.Second, "LISTEN connection closed after the last subscriber left", listening(0))
	eventually(t, 10*time.Second, "listen goroutine ended", func() (bool, error) {
		r.ln.mu.Lock()
		defer r.ln.mu.Unlock()
		return r.ln.running == 0, nil
	})

	_, c3 := r.Subscribe("a")
	defer c3()
	eventually(t, 10*time.Second, "LISTEN connection again for a new subscriber", listening(1))
	if err := r.Close(); err != nil {
		t.Fatal(err)
	}
	eventually(t, 10*time.Second, "LISTEN connection closed by Close", listening(0))
	if ch, cancel := r.Subscribe("a"); ch != nil {
		cancel()
		t.Errorf("Subscribe after Close returned a channel")
	}
	// The pool is the caller's: still open.
	if err := r.pool.Ping(t.Context()); err != nil {
		t.Errorf("pool unusable after Close: %v", err)
	}
}

// blackholeProxy forwards TCP connections to a server. blackhole makes
// the connections open at that moment keep forwarding requests but drop
// every reply: the fault a real server cannot give, a reply lost after the
// request was executed.
type blackholeProxy struct {
	ln    net.Listener
	mu    sync.Mutex
	conns []*atomic.Bool
}

func newBlackholeProxy(t *testing.T, target string) *blackholeProxy {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &blackholeProxy{ln: ln}
	var wg sync.WaitGroup
	t.Cleanup(func() { ln.Close(); wg.Wait() })
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			s, err := net.Dial("tcp", target)
			if err != nil {
				c.Close()
				continue
			}
			drop := &atomic.Bool{}
			p.mu.Lock()
			p.conns = append(p.conns, drop)
			p.mu.Unlock()
			wg.Add(2)
			go func() { defer wg.Done(); io.Copy(s, c); s.Close() }()
			go func() {
				defer wg.Done()
				buf := make([]byte, 32<<10)
				for {
					n, err := s.Read(buf)
					if n > 0 && !drop.Load() {
						c.Write(buf[:n])
					}
					if err != nil {
						c.Close()
						return
					}
				}
			}()
		}
	}()
	return p
}

func (p *blackholeProxy) blackhole() {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, d := range p.conns {
		d.Store(true)
	}
}

// testAmbiguousAcquire loses the reply of an acquire that the server
// executed and committed: it takes over an expired row. TryAcquire cannot
// know: it returns at its context's end with an AbandonedError, whose
// Cleanup, once no reply has come a second past the statement's bound,
// must delete its owner's row. Were the takeover not undone, the row
// would stay with the new owner; had the statement not run, the old
// owner's expired row would stay.
func testAmbiguousAcquire(t *testing.T, pg *pgFixture) {
	cfg, err := pgxpool.ParseConfig(pg.dsn)
	if err != nil {
		t.Fatal(err)
	}
	proxy := newBlackholeProxy(t, net.JoinHostPort(cfg.ConnConfig.Host, strconv.Itoa(int(cfg.ConnConfig.Port))))
	_, port, _ := net.SplitHostPort(proxy.ln.Addr().String())
	pool := pg.pool(t, func(c *pgxpool.Config) {
		c.ConnConfig.Host = "127.0.0.1"
		p, _ := strconv.Atoi(port)
		c.ConnConfig.Port = uint16(p)
		c.ConnConfig.Fallbacks = nil
		c.MaxConns = 1
	})
	r := pg.resource(t, pool)
	a := pg.resource(t, pg.pool(t, nil))

	// Warm the one connection up: its acquire statement is prepared.
	warm := newLease(t, testsuite.Key(t), time.Minute)
	mustAcquire(t, r, warm)
	if err := r.Release(t.Context(), warm); err != nil {
		t.Fatal(err)
	}

	key := testsuite.Key(t)
	la := newLease(t, key, 50*time.Millisecond)
	mustAcquire(t, a, la)
	waitExpired(t, pg.fixture(), key)

	proxy.blackhole()
	lb := newLease(t, key, time.Minute)
	ctx, cancel := context.WithTimeout(t.Context(), 300*time.Millisecond)
	defer cancel()
	_, _, err = r.TryAcquire(ctx, lb)
	var ab *backend.AbandonedError
	if !errors.As(err, &ab) || !errors.Is(err, context.DeadlineExceeded) || errors.Is(err, backend.ErrNotAcquired) {
		t.Fatalf("TryAcquire with its reply lost = %v; want an AbandonedError wrapping ctx's error", err)
	}
	cctx, ccancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer ccancel()
	if err := ab.Cleanup(cctx); err != nil {
		t.Fatalf("Cleanup: %v", err)
	}
	wantRows(t, pg.fixture(), key)
}

// testLateStatement runs the acquire statement with a server-side bound
// already past when it gets to write (1µs): on a free key, on an expired
// row and on a live holder's row it must write nothing, and say so with
// the error TryAcquire maps to a store error wrapping
// context.DeadlineExceeded (or no row at all: nothing to take).
func testLateStatement(t *testing.T, pg *pgFixture) {
	f := pg.fixture()
	p := pg.resource(t, pg.pool(t, nil))
	other := pg.resource(t, pg.pool(t, nil))
	run := func(l *backend.Lease) pgReply {
		c, err := p.pool.Acquire(t.Context())
		if err != nil {
			t.Fatal(err)
		}
		defer c.Release()
		// pg_sleep is not needed: a 1µs bound has passed by the time the
		// statement gets past its advisory lock.
		return p.acquireOn(t.Context(), new(pgCall), c, l, time.Microsecond)
	}
	free := newLease(t, testsuite.Key(t), time.Minute)
	if r := run(free); !pgLate(r.err) {
		t.Errorf("late acquire of a free key = %+v; want the NOT NULL violation on token", r)
	}
	if _, _, err := p.outcome(t.Context(), free, run(free), time.Microsecond); !errors.Is(err, context.DeadlineExceeded) || errors.Is(err, backend.ErrNotAcquired) {
		t.Errorf("TryAcquire's error for a late statement = %v; want one wrapping context.DeadlineExceeded", err)
	}
	wantRows(t, f, free.Key)

	expired := newLease(t, testsuite.Key(t), 50*time.Millisecond)
	mustAcquire(t, other, expired)
	waitExpired(t, f, expired.Key)
	late := newLease(t, expired.Key, time.Minute)
	if r := run(late); r.err == nil && r.ours {
		t.Errorf("late acquire took an expired row over: %+v", r)
	}
	wantRows(t, f, expired.Key, expired.Value)

	held := newLease(t, testsuite.Key(t), time.Minute)
	mustAcquire(t, other, held)
	if r := run(newLease(t, held.Key, time.Minute)); r.err == nil && r.ours {
		t.Errorf("late acquire took a live row: %+v", r)
	}
	wantRows(t, f, held.Key, held.Value)
	if err := other.Release(t.Context(), held); err != nil {
		t.Fatal(err)
	}
	// The same statement with time to spare takes the key.
	l := newLease(t, held.Key, time.Minute)
	c, err := p.pool.Acquire(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	r := p.acquireOn(t.Context(), new(pgCall), c, l, time.Minute)
	c.Release()
	if r.err != nil || !r.ours {
		t.Errorf("acquire with a 1min bound = %+v; want the key", r)
	}
}

// testRefreshAllOneStatement: a batch of mutexes is renewed by one
// statement, whatever its size.
func testRefreshAllOneStatement(t *testing.T, pg *pgFixture) {
	tr := &tracer{}
	r := pg.resource(t, pg.pool(t, tracedPool(tr, nil)))
	base := testsuite.Key(t)
	var ls []*backend.Lease
	for i := range backend.MaxRefreshBatch {
		l := newLease(t, base+strconv.Itoa(i), time.Minute)
		ls = append(ls, l)
	}
	if err := parallel(ls, func(l *backend.Lease) error { _, _, err := r.TryAcquire(t.Context(), l); return err }); err != nil {
		t.Fatal(err)
	}
	tr.reset()
	for i, err := range r.RefreshAll(t.Context(), ls) {
		if err != nil {
			t.Fatalf("RefreshAll: lease %d: %v", i, err)
		}
	}
	if n := len(tr.reset()); n != 1 {
		t.Errorf("RefreshAll of %d mutexes sent %d statements; want 1", len(ls), n)
	}
	if err := parallel(ls, func(l *backend.Lease) error { return r.Release(t.Context(), l) }); err != nil {
		t.Fatal(err)
	}
}

// parallel runs fn for each lease, 8 at a time, and returns the first
// error.
func parallel(ls []*backend.Lease, fn func(*backend.Lease) error) error {
	var (
		wg    sync.WaitGroup
		mu    sync.Mutex
		first error
	)
	sem := make(chan struct{}, 8)
	for _, l := range ls {
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			if err := fn(l); err != nil {
				mu.Lock()
				first = cmp.Or(first, err)
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	return first
}

// testNotifyKinds: the release of a semaphore's permit, of a read grant
// and of the mutex of a key that is not text (its payload is hex) wakes
// the subscribers of the key.
func testNotifyKinds(t *testing.T, pg *pgFixture) {
	a := pg.resource(t, pg.pool(t, nil))
	b := pg.resource(t, pg.pool(t, nil))
	base := testsuite.Key(t)
	sem := newLease(t, base+"-sem", time.Minute)
	sem.Kind, sem.Limit = backend.KindSemaphore, 1
	rd := newLease(t, base+"-rw", time.Minute)
	rd.Kind = backend.KindRead
	odd := newLease(t, base+"-\x00\xff", time.Minute)
	held := []*backend.Lease{sem, rd, odd}
	for _, l := range held {
		mustAcquire(t, a, l)
	}
	wr := newLease(t, rd.Key, time.Minute)
	wr.Kind = backend.KindWrite
	contenders := []*backend.Lease{newLease(t, sem.Key, time.Minute), wr, newLease(t, odd.Key, time.Minute)}
	contenders[0].Kind, contenders[0].Limit = backend.KindSemaphore, 1
	for _, l := range contenders {
		if ok, _, err := b.TryAcquire(t.Context(), l); ok || err != nil {
			t.Fatalf("contended TryAcquire(%q, %v) = %v, %v; want false, nil", l.Key, l.Kind, ok, err)
		}
	}
	var chs []<-chan struct{}
	for _, l := range contenders {
		ch, cancel := b.Subscribe(l.Key)
		defer cancel()
		chs = append(chs, ch)
	}
	for _, ch := range chs { // the wake of the LISTEN connection's start
		select {
		case <-ch:
		case <-time.After(10 * time.Second):
			t.Fatalf("no wake after the LISTEN connection came up")
		}
	}
	for i, l := range held {
		if err := a.Release(t.Context(), l); err != nil {
			t.Fatal(err)
		}
		select {
		case <-chs[i]:
		case <-time.After(10 * time.Second):
			t.Fatalf("no notice for the release of %q (%v)", l.Key, l.Kind)
		}
	}
	if err := b.Withdraw(t.Context(), wr); err != nil {
		t.Fatal(err)
	}
}
