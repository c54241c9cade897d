package sqldb

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/distlock/distlock"
	"github.com/distlock/distlock/backend"
	"github.com/distlock/distlock/testsuite"
)

// TestPostgres runs everything on one PostgreSQL server.
func TestPostgres(t *testing.T) {
	pg := newPG(t)
	f := pg.fixture()
	t.Run("Conformance", func(t *testing.T) { testsuite.Run(t, harness(f)) })
	runCommon(t, f)
	t.Run("NoClientTimeSent", func(t *testing.T) { testNoClientTime(t, pg) })
	t.Run("SerializationFailureIsContention", func(t *testing.T) { testSerializationFailure(t, pg) })
	t.Run("ReleaseRacingRefresh", func(t *testing.T) { testReleaseRacingRefresh(t, pg) })
	t.Run("SerializableWorkload", func(t *testing.T) { testSerializableWorkload(t, pg) })
	t.Run("Notify", func(t *testing.T) { testNotify(t, pg) })
	t.Run("NotifyKinds", func(t *testing.T) { testNotifyKinds(t, pg) })
	t.Run("ListenConnectionOnlyWhileWaiting", func(t *testing.T) { testListenLifecycle(t, pg) })
	t.Run("AmbiguousAcquireCleansUp", func(t *testing.T) { testAmbiguousAcquire(t, pg) })
	t.Run("LateStatementWritesNothing", func(t *testing.T) { testLateStatement(t, pg) })
	t.Run("ConcurrentSetup", func(t *testing.T) { testConcurrentSetup(t, pgNewRes(pg)) })
	t.Run("LeastPrivilege", func(t *testing.T) { testPostgresLeastPrivilege(t, pg) })
	t.Run("TableSpellingsTokenOrder", func(t *testing.T) { testSpellingsTokenOrder(t, pg) })
	t.Run("TableSpellingsNotify", func(t *testing.T) { testSpellingsNotify(t, pg) })
	t.Run("TableSpellingsConcurrency", func(t *testing.T) { testSpellingsConcurrency(t, pg) })
	t.Run("ListenWithPoolHooks", func(t *testing.T) { testListenDynamicCredentials(t, pg) })
	t.Run("RefreshAllOneStatement", func(t *testing.T) { testRefreshAllOneStatement(t, pg) })
	t.Run("QueueOrderMutex", func(t *testing.T) { testQueueOrder(t, pg, backend.KindMutex) })
	t.Run("SemaphoreHeadNotice", func(t *testing.T) { testSemaphoreHeadNotice(t, pg) })
	t.Run("DeadHeadPassedOver", func(t *testing.T) { testDeadHeadPassedOver(t, pg) })
	t.Run("HeadWithdraws", func(t *testing.T) { testHeadWithdraws(t, pg) })
	t.Run("WithdrawnInFlight", func(t *testing.T) { testWithdrawnInFlight(t, pg) })
	t.Run("HandoffStatements", func(t *testing.T) { testHandoffStatements(t, pg) })
	t.Run("EndAfterReply", func(t *testing.T) { testEndAfterReply(t, pg) })
	t.Run("UncancellableWaiterQueues", func(t *testing.T) { testUncancellableWaiterQueues(t, pg) })
	t.Run("IntentLapsesWithWait", func(t *testing.T) { testIntentLapsesWithWait(t, pg) })
	t.Run("HintLastLapseAhead", func(t *testing.T) { testHintLastLapseAhead(t, pg) })
	t.Run("ShortHoldsAllAtOnce", func(t *testing.T) { testShortHoldsAllAtOnce(t, pg) })
	t.Run("ShortWaitsManyProcesses", func(t *testing.T) { testShortWaitsManyProcesses(t, pg) })
	t.Run("LateReplyRead", func(t *testing.T) { testLateReplyRead(t, pg) })
	t.Run("TakenLateCleanedOnOwnConn", func(t *testing.T) { testTakenLateCleanedOnOwnConn(t, pg) })
	t.Run("GatedStatements", func(t *testing.T) { testGatedStatements(t, pg) })
	t.Run("CleanupsAskFew", func(t *testing.T) { testCleanupsAskFew(t, pg) })
}

// TestMariaDB runs everything on one MariaDB server.
func TestMariaDB(t *testing.T) {
	my := newMy(t)
	f := my.fixture()
	t.Run("Conformance", func(t *testing.T) { testsuite.Run(t, harness(f)) })
	runCommon(t, f)
	t.Run("OwnerTooLong", func(t *testing.T) { testOwnerTooLong(t, f) })
	t.Run("NoClientTimeSent", func(t *testing.T) { testMySQLNoClientTime(t, my) })
	t.Run("ConcurrentSetup", func(t *testing.T) { testConcurrentSetup(t, myNewRes(my)) })
	t.Run("LeastPrivilege", func(t *testing.T) { testMySQLLeastPrivilege(t, my) })
	t.Run("CounterRowDeleted", func(t *testing.T) { testCounterRowDeleted(t, my) })
	t.Run("KeysDoNotSerialize", func(t *testing.T) { testKeysDoNotSerialize(t, my) })
	t.Run("KindsNoTempTables", func(t *testing.T) { testKindsNoTempTables(t, my) })
	t.Run("KindsExpiredEntries", func(t *testing.T) { testKindsExpiredEntries(t, my) })
	t.Run("KindsExpiredOwnEntry", func(t *testing.T) { testKindsExpiredOwnEntry(t, my) })
	t.Run("KindsGrantToken", func(t *testing.T) { testKindsGrantToken(t, my) })
}

func harness(f fixture) testsuite.Harness {
	h := testsuite.Harness{
		NewResource: func(t *testing.T) backend.RemoteResource { return f.newResource(t) },
		// Every row of the key counts, of every kind, expired or not: a
		// released or abandoned-then-unlocked lock must leave no row at
		// all.
		Leftovers: f.rows,
		Evict:     f.evict,
		Requests:  f.requests,
		MaxKeyLen: MaxKeyLen, // the suite's keys are ASCII: characters = bytes
		// A pool or *sql.DB the application closed under the resource.
		NewClosedResource: func(t *testing.T) backend.RemoteResource { return f.closed(t) },
		// Another session locks the lock table, as a migration would.
		Stall: f.stallHarness,
		// The server's address refuses the pool's new connections.
		NewRefusedResource: func(t *testing.T) backend.RemoteResource { return f.refused(t) },
		RefusedCause:       "connection refused",
	}
	if f.name == "mariadb" {
		h.NoLine = map[backend.Kind]string{
			backend.KindMutex: "MySQL keeps no line of mutex waiters (it has no notices to wake a head with; semaphore waiters and read/write requests are ordered): after a release, whichever waiter tries first gets the lock",
		}
	}
	return h
}

// runCommon runs the subtests both stores share.
func runCommon(t *testing.T, f fixture) {
	t.Run("ContendedAttempt", func(t *testing.T) { testContended(t, f) })
	t.Run("ExpiredRowIsTakenOver", func(t *testing.T) { testTakeover(t, f) })
	t.Run("ReleaseDeletesOwnExpiredRow", func(t *testing.T) { testReleaseExpired(t, f) })
	t.Run("RefreshUsesServerClock", func(t *testing.T) { testRefresh(t, f) })
	t.Run("BadKeyNoIO", func(t *testing.T) { testBadKeyNoIO(t, f) })
	t.Run("ServerClockRules", func(t *testing.T) { testServerClock(t, f) })
	t.Run("KilledHolderKeepsLockUntilTTL", func(t *testing.T) { testKilledHolder(t, f) })
	t.Run("Concurrency", func(t *testing.T) { testConcurrency(t, f.newResource) })
	t.Run("ConcurrencyManyKeys", func(t *testing.T) { testConcurrencyManyKeys(t, f.newResource) })
	t.Run("NoGoroutineLeak", func(t *testing.T) { testNoGoroutineLeak(t, f) })
	t.Run("CancelWhileStatementRuns", func(t *testing.T) { testCancelWhileRunning(t, f) })
	t.Run("StalledTable", func(t *testing.T) { testStalledTable(t, f) })
	t.Run("GroupRowGone", func(t *testing.T) { testGroupRowGone(t, f) })
	t.Run("RefreshAll", func(t *testing.T) { testRefreshAll(t, f) })
	t.Run("CancelledWriterLeavesNoIntent", func(t *testing.T) { testCancelledWriterLeavesNoIntent(t, f) })
	t.Run("SemaphoreLine", func(t *testing.T) { testSemaphoreLine(t, f) })
}

// testCancelWhileRunning cancels an acquire whose statement is waiting on
// the server (on a lock an admin session holds) and only then lets the
// statement go on. TryAcquire must return at once, abandoning the
// statement with an AbandonedError wrapping ctx's error; its Cleanup must
// wait for the statement's reply, whatever it was (PostgreSQL cancels the
// statement; on MariaDB it inserts the row and commits), and leave no
// row. A clean-up that did not wait for the statement would find nothing
// and leave the row behind (the safety suite's CancelStorm found it by
// chance; here it is staged).
func testCancelWhileRunning(t *testing.T, f fixture) {
	r := f.newResource(t)
	key := testsuite.Key(t)
	waiting, release := f.stall(t, key)
	released := false
	defer func() {
		if !released {
			release()
		}
	}()
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	l := newLease(t, key, time.Minute)
	type result struct {
		ok  bool
		err error
	}
	done := make(chan result, 1)
	go func() {
		ok, _, err := r.TryAcquire(ctx, l)
		done <- result{ok, err}
	}()
	eventually(t, 10*time.Second, "the acquire statement waits on the server", waiting)
	cancel()
	var res result
	select {
	case res = <-done:
	case <-time.After(10 * time.Second):
		t.Fatalf("TryAcquire did not return within 10s of its context's end")
	}
	var ab *backend.AbandonedError
	if res.ok || !errors.Is(res.err, context.Canceled) || !errors.As(res.err, &ab) || ab.Cleanup == nil {
		t.Fatalf("TryAcquire cancelled mid-statement = %v, %v; want false and an AbandonedError wrapping ctx's error", res.ok, res.err)
	}
	release()
	released = true
	cctx, ccancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer ccancel()
	if err := ab.Cleanup(cctx); err != nil {
		t.Fatalf("Cleanup: %v", err)
	}
	eventually(t, 10*time.Second, "the acquire statement has finished", func() (bool, error) {
		w, err := waiting()
		return !w, err
	})
	wantRows(t, f, key)
}

// testStalledTable: the calls the conformance suite's StalledStore case
// bounds (its Stall locks the table too) leave statements on the server
// when they return: another session locks the lock table (a migration,
// say) while a TryLock with a 300ms context and a 5s wait and a TryLock
// with a 500ms wait give up. Once those statements have ended on the
// server (PostgreSQL cancels them, MariaDB cuts them at their bound) the
// table is unlocked, and no abandoned attempt may have written a row,
// then or later (a trigger records every write), nor left one.
func testStalledTable(t *testing.T, f fixture) {
	table := fmt.Sprintf("stall_%d", time.Now().UnixNano()%1e9)
	r := f.newResourceWith(t, WithTable(table))
	d, err := distlock.New(r, distlock.WithDefaultTTL(time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	key := testsuite.Key(t)
	kCtx, kWait := key+"-ctx", key+"-wait"
	commits := f.audit(t, table, kCtx, kWait)
	resume := f.lockTable(t, table)

	cctx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
	if lk, err := d.TryLock(cctx, kCtx, 5*time.Second); lk != nil || !errors.Is(err, distlock.ErrNotAcquired) {
		t.Errorf("TryLock with a 300ms context on a locked table = %v, %v; want ErrNotAcquired", lk, err)
	}
	cancel()
	if lk, err := d.TryLock(ctx, kWait, 500*time.Millisecond); lk != nil || err == nil {
		t.Errorf("TryLock with a 500ms wait on a locked table = %v, %v; want a store error", lk, err)
	}
	// The abandoned statements end on the server while the table is still
	// locked; then the store answers again.
	eventually(t, 10*time.Second, "no acquire statement runs on the server", func() (bool, error) {
		n, err := f.acquiresWaiting(ctx, table)
		return n == 0, err
	})
	resume()
	if err := d.Close(); err != nil { // waits for the clean-ups
		t.Errorf("Close once the table is unlocked = %v", err)
	}
	late, err := commits(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if late != 0 {
		t.Errorf("%d acquire statements of the abandoned attempts committed after their TryLock returned; want 0", late)
	}
	for _, k := range []string{kCtx, kWait} {
		if left, err := f.rowsIn(ctx, table, k); err != nil || len(left) > 0 {
			t.Errorf("rows of %q once the clean-ups ran: %q, %v; want none", k, left, err)
		}
	}
}

func newLease(t *testing.T, key string, ttl time.Duration) *backend.Lease {
	return &backend.Lease{Key: key, Value: testsuite.Key(t), TTL: ttl}
}

func mustAcquire(t *testing.T, r resource, l *backend.Lease) {
	t.Helper()
	ok, _, err := r.TryAcquire(t.Context(), l)
	if err != nil || !ok {
		t.Fatalf("TryAcquire(%q) = %v, %v; want acquired", l.Key, ok, err)
	}
	if l.Token == 0 {
		t.Fatalf("TryAcquire(%q) left Token 0", l.Key)
	}
}

func wantRows(t *testing.T, f fixture, key string, want ...string) {
	t.Helper()
	got, err := f.rows(context.Background(), key)
	if err != nil {
		t.Fatalf("rows(%q): %v", key, err)
	}
	var w []string
	for _, o := range want {
		w = append(w, "row owned by "+o)
	}
	if strings.Join(got, ",") != strings.Join(w, ",") {
		t.Fatalf("rows(%q) = %q; want %q", key, got, w)
	}
}

// waitExpired polls until key's row has expired by the server's clock.
func waitExpired(t *testing.T, f fixture, key string) {
	t.Helper()
	eventually(t, 10*time.Second, "row expires", func() (bool, error) {
		left, err := f.remaining(context.Background(), key)
		return err == nil && left <= 0, err
	})
}

func testContended(t *testing.T, f fixture) {
	a, b := f.newResource(t), f.newResource(t)
	key := testsuite.Key(t)
	la := newLease(t, key, 10*time.Second)
	mustAcquire(t, a, la)
	lb := newLease(t, key, time.Second)
	ok, holderTTL, err := b.TryAcquire(t.Context(), lb)
	if ok || err != nil {
		t.Fatalf("contended TryAcquire = %v, %v; want false, nil", ok, err)
	}
	if holderTTL < 0 || holderTTL > 10*time.Second {
		t.Errorf("holderTTL = %v; want within [0, 10s]", holderTTL)
	}
	if holderTTL <= 0 {
		t.Errorf("holderTTL = %v; the first contender learns the holder's remaining time", holderTTL)
	}
	if lb.Token != 0 {
		t.Errorf("failed attempt set Token %d", lb.Token)
	}
	if err := b.Release(t.Context(), lb); !errors.Is(err, backend.ErrNotHeld) {
		t.Errorf("Release by a non-owner = %v; want ErrNotHeld", err)
	}
	if err := b.Refresh(t.Context(), lb); !errors.Is(err, backend.ErrNotHeld) {
		t.Errorf("Refresh by a non-owner = %v; want ErrNotHeld", err)
	}
	wantRows(t, f, key, la.Value)
	if err := a.Release(t.Context(), la); err != nil {
		t.Fatalf("Release: %v", err)
	}
	wantRows(t, f, key)
}

func testTakeover(t *testing.T, f fixture) {
	a, b, c := f.newResource(t), f.newResource(t), f.newResource(t)
	key := testsuite.Key(t)
	la := newLease(t, key, 50*time.Millisecond)
	mustAcquire(t, a, la)
	waitExpired(t, f, key)
	lb := newLease(t, key, time.Minute)
	mustAcquire(t, b, lb) // the stale row is no dead end
	if lb.Token <= la.Token {
		t.Errorf("token after takeover %d <= previous %d", lb.Token, la.Token)
	}
	if err := a.Refresh(t.Context(), la); !errors.Is(err, backend.ErrNotHeld) {
		t.Errorf("Refresh by the expired owner = %v; want ErrNotHeld", err)
	}
	if err := a.Release(t.Context(), la); !errors.Is(err, backend.ErrNotHeld) {
		t.Errorf("Release by the expired owner = %v; want ErrNotHeld", err)
	}
	wantRows(t, f, key, lb.Value) // the new owner's row is untouched
	if ok, _, err := c.TryAcquire(t.Context(), newLease(t, key, time.Second)); ok || err != nil {
		t.Errorf("TryAcquire while the new owner holds = %v, %v; want false, nil", ok, err)
	}
	if err := b.Release(t.Context(), lb); err != nil {
		t.Fatalf("Release: %v", err)
	}
	wantRows(t, f, key)
}

func testReleaseExpired(t *testing.T, f fixture) {
	a := f.newResource(t)
	key := testsuite.Key(t)
	la := newLease(t, key, 50*time.Millisecond)
	mustAcquire(t, a, la)
	waitExpired(t, f, key)
	if err := a.Release(t.Context(), la); !errors.Is(err, backend.ErrNotHeld) {
		t.Errorf("Release of an expired lease = %v; want ErrNotHeld", err)
	}
	wantRows(t, f, key) // and no stale row stays behind
}

func testRefresh(t *testing.T, f fixture) {
	a := f.newResource(t)
	key := testsuite.Key(t)
	l := newLease(t, key, 5*time.Second)
	mustAcquire(t, a, l)
	if left, err := f.remaining(t.Context(), key); err != nil || left > 5*time.Second || left < 4*time.Second {
		t.Fatalf("remaining after acquire = %v, %v; want about 5s", left, err)
	}
	l.TTL = time.Hour
	if err := a.Refresh(t.Context(), l); err != nil {
		t.Fatalf("Refresh: %v", err)
	}
	if left, err := f.remaining(t.Context(), key); err != nil || left > time.Hour || left < 59*time.Minute {
		t.Fatalf("remaining after Refresh = %v, %v; want about 1h", left, err)
	}
	if err := a.Release(t.Context(), l); err != nil {
		t.Fatalf("Release: %v", err)
	}
	if err := a.Refresh(t.Context(), l); !errors.Is(err, backend.ErrNotHeld) {
		t.Errorf("Refresh after Release = %v; want ErrNotHeld", err)
	}
	wantRows(t, f, key)
}

// testBadKeyNoIO uses a resource whose client is closed: a call that
// reached the database would fail with the client's error instead.
func testBadKeyNoIO(t *testing.T, f fixture) {
	r := f.closed(t)
	long := strings.Repeat("k", MaxKeyLen+1)
	for _, key := range []string{"", long} {
		l := &backend.Lease{Key: key, Value: "v", TTL: time.Second}
		for name, err := range map[string]error{
			"ValidateKey": r.ValidateKey(key),
			"TryAcquire":  func() error { _, _, err := r.TryAcquire(t.Context(), l); return err }(),
			"Release":     r.Release(t.Context(), l),
			"Refresh":     r.Refresh(t.Context(), l),
		} {
			if err == nil || !strings.HasPrefix(err.Error(), "sqldb: key") && !strings.HasPrefix(err.Error(), "sqldb: empty key") {
				t.Errorf("%s(%.10q...) = %v; want a key error before any I/O", name, key, err)
			}
		}
	}
	// Through the facade: ErrInvalid.
	d, err := distlock.New(r)
	if err != nil {
		t.Fatalf("distlock.New: %v", err)
	}
	if _, err := d.TryLock(t.Context(), long, 0); !errors.Is(err, distlock.ErrInvalid) {
		t.Errorf("TryLock(long key) = %v; want ErrInvalid", err)
	}
	// And a good key does reach the (closed) client: the test can fail.
	if _, _, err := r.TryAcquire(t.Context(), &backend.Lease{Key: "k", Value: "v", TTL: time.Second}); err == nil {
		t.Errorf("TryAcquire over a closed client succeeded")
	}
}

func testOwnerTooLong(t *testing.T, f fixture) {
	r := f.closed(t)
	l := &backend.Lease{Key: "k", Value: strings.Repeat("v", maxOwnerLen+1), TTL: time.Second}
	if _, _, err := r.TryAcquire(t.Context(), l); err == nil || !strings.Contains(err.Error(), "owner value") {
		t.Errorf("TryAcquire with a 256-byte owner = %v; want an owner-length error before I/O", err)
	}
}

// testServerClock shows that expiry is judged by the database's clock and
// nothing else. The library sends no timestamps (TestPostgres/
// NoClientTimeSent checks the wire), so the only client-side notion of time
// left is the session: here the two owners' sessions run 25 hours apart
// (UTC-12 and UTC+13). Were expiry computed in the session's local time
// (PostgreSQL timestamp without time zone, MySQL NOW() into DATETIME),
// the +13 owner would see the -12 owner's row as expired a day ago and take
// it at once; were it computed by the -12 session for a +13 row, the row
// would look a day away from expiry and the takeover below would never
// come.
func testServerClock(t *testing.T, f fixture) {
	west, east := f.inZone(t, "-12:00"), f.inZone(t, "+13:00")
	for _, pair := range []struct {
		name         string
		first, other resource
	}{{"west holds", west, east}, {"east holds", east, west}} {
		key := testsuite.Key(t)
		l1 := newLease(t, key, 400*time.Millisecond)
		mustAcquire(t, pair.first, l1)
		l2 := newLease(t, key, time.Minute)
		if ok, _, err := pair.other.TryAcquire(t.Context(), l2); ok || err != nil {
			t.Fatalf("%s: other zone's TryAcquire before expiry = %v, %v; want false, nil", pair.name, ok, err)
		}
		if left, err := f.remaining(t.Context(), key); err != nil || left <= 0 || left > 400*time.Millisecond {
			t.Fatalf("%s: server says %v, %v left; want within (0, 400ms]", pair.name, left, err)
		}
		waitExpired(t, f, key)
		ok, _, err := pair.other.TryAcquire(t.Context(), l2)
		if !ok || err != nil {
			t.Fatalf("%s: other zone's TryAcquire after the server's expiry = %v, %v; want acquired", pair.name, ok, err)
		}
		if l2.Token <= l1.Token {
			t.Errorf("%s: token %d <= %d", pair.name, l2.Token, l1.Token)
		}
		if err := pair.other.Release(t.Context(), l2); err != nil {
			t.Fatalf("Release: %v", err)
		}
	}
}

// testKilledHolder kills the holder's connection on the server: the lock is
// a row, not a session, so it stays held until its TTL runs out by the
// server's clock; then the next owner takes the stale row over.
func testKilledHolder(t *testing.T, f fixture) {
	holder, kill := f.killable(t)
	other := f.newResource(t)
	key := testsuite.Key(t)
	const ttl = 2 * time.Second
	l1 := newLease(t, key, ttl)
	mustAcquire(t, holder, l1)
	kill()
	l2 := newLease(t, key, time.Minute)
	if ok, _, err := other.TryAcquire(t.Context(), l2); ok || err != nil {
		t.Fatalf("TryAcquire right after the holder's connection died = %v, %v; want false, nil", ok, err)
	}
	if left, err := f.remaining(t.Context(), key); err != nil || left <= 0 {
		t.Fatalf("server says %v, %v left; want the TTL still running", left, err)
	}
	wantRows(t, f, key, l1.Value)
	waitExpired(t, f, key)
	ok, _, err := other.TryAcquire(t.Context(), l2)
	if !ok || err != nil {
		t.Fatalf("TryAcquire after the TTL = %v, %v; want acquired", ok, err)
	}
	if l2.Token <= l1.Token {
		t.Errorf("token %d <= dead holder's %d", l2.Token, l1.Token)
	}
	// The dead holder's pool reconnects; its lease is gone.
	if err := holder.Release(t.Context(), l1); !errors.Is(err, backend.ErrNotHeld) {
		t.Errorf("dead holder's Release = %v; want ErrNotHeld", err)
	}
	if err := other.Release(t.Context(), l2); err != nil {
		t.Fatalf("Release: %v", err)
	}
	wantRows(t, f, key)
}

// testConcurrency runs 3 instances x 4 goroutines on one key through
// distlock.New: never two holders, tokens strictly increasing, no errors.
func testConcurrency(t *testing.T, newResource func(t testing.TB) resource) {
	testConcurrencyKeys(t, newResource, []string{testsuite.Key(t)}, 10)
}

// testConcurrencyManyKeys runs the workload over six keys, in pairs that
// draw their tokens from one MySQL counter row (see counterKey), each
// goroutine picking a random key per round: per key never two holders and
// tokens strictly increasing, whatever the other keys on its counter do.
func testConcurrencyManyKeys(t *testing.T, newResource func(t testing.TB) resource) {
	var keys []string
	for range 3 {
		k := testsuite.Key(t)
		other := k
		for i := 0; other == k || counterKey(other) != counterKey(k); i++ {
			other = fmt.Sprintf("%s-%d", k, i)
		}
		keys = append(keys, k, other)
	}
	testConcurrencyKeys(t, newResource, keys, 20)
}

// testConcurrencyKeys runs 3 instances x 4 goroutines through
// distlock.New, each taking rounds locks on keys picked at random: per key
// never two holders, tokens strictly increasing, no errors.
func testConcurrencyKeys(t *testing.T, newResource func(t testing.TB) resource, keys []string, rounds int) {
	const instances, workers = 3, 4
	type keyState struct {
		inside  atomic.Int32
		mu      sync.Mutex
		lastTok uint64
	}
	state := make(map[string]*keyState)
	for _, k := range keys {
		state[k] = &keyState{}
	}
	var (
		acquired atomic.Int64
		wg       sync.WaitGroup
	)
	for i := range instances {
		d, err := distlock.New(newResource(t), distlock.WithSpin(2*time.Millisecond, 3*time.Millisecond))
		if err != nil {
			t.Fatalf("distlock.New: %v", err)
		}
		t.Cleanup(func() { d.Close() })
		for w := range workers {
			wg.Add(1)
			go func() {
				defer wg.Done()
				rng := rand.New(rand.NewPCG(uint64(i), uint64(w)))
				for range rounds {
					key := keys[rng.IntN(len(keys))]
					st := state[key]
					lk, err := d.TryLock(t.Context(), key, time.Minute)
					if err != nil {
						t.Errorf("TryLock(%q): %v", key, err)
						return
					}
					if n := st.inside.Add(1); n != 1 {
						t.Errorf("%q: %d holders at once", key, n)
					}
					st.mu.Lock()
					if lk.Token() <= st.lastTok {
						t.Errorf("%q: token %d <= previous holder's %d", key, lk.Token(), st.lastTok)
					}
					st.lastTok = lk.Token()
					st.mu.Unlock()
					time.Sleep(time.Millisecond) // a window a second holder would use
					st.inside.Add(-1)
					acquired.Add(1)
					if err := lk.Unlock(context.Background()); err != nil {
						t.Errorf("Unlock(%q): %v", key, err)
					}
				}
			}()
		}
	}
	wg.Wait()
	if got := acquired.Load(); got != int64(instances*workers*rounds) {
		t.Errorf("acquired %d times; want %d", got, instances*workers*rounds)
	}
}

// testGroupRowGone releases the read grants of one read/write lock from
// several goroutines at once, again and again: the last release must
// delete the row whichever statement saw what. (A release that judged by
// its statement's snapshot, in which another reader was still live,
// updated the latest version, where none was, and left an empty row
// behind: the suite's RWMutex/Exclusion found it now and then.)
func testGroupRowGone(t *testing.T, f fixture) {
	const readers = 4
	rs := make([]resource, readers)
	for i := range rs {
		rs[i] = f.newResource(t)
	}
	key := testsuite.Key(t)
	for round := range 60 {
		ls := make([]*backend.Lease, readers)
		for i := range ls {
			ls[i] = newLease(t, key, time.Minute)
			ls[i].Kind = backend.KindRead
			mustAcquire(t, rs[i], ls[i])
		}
		var wg sync.WaitGroup
		start := make(chan struct{})
		errs := make([]error, readers)
		for i := range ls {
			wg.Go(func() {
				<-start
				errs[i] = rs[i].Release(context.Background(), ls[i])
			})
		}
		close(start)
		wg.Wait()
		for i, err := range errs {
			if err != nil {
				t.Fatalf("round %d: Release of reader %d: %v", round, i, err)
			}
		}
		if left, err := f.rows(t.Context(), key); err != nil || len(left) > 0 {
			t.Fatalf("round %d: every reader released, the table holds %q (err %v); want nothing", round, left, err)
		}
	}
}

// testRefreshAll renews a batch that mixes live mutexes, a mutex evicted
// behind its owner's back, one whose lease ran out and another owner
// took, a key of odd bytes and a semaphore's permit: one result per
// lease, in order, and only the live ones extended.
func testRefreshAll(t *testing.T, f fixture) {
	r, other := f.newResource(t), f.newResource(t)
	br, ok := r.(backend.BatchRefresher)
	if !ok {
		t.Fatalf("%T is not a backend.BatchRefresher", r)
	}
	base := testsuite.Key(t)
	live1, live2 := newLease(t, base+"-1", 2*time.Second), newLease(t, base+"-2", 2*time.Second)
	odd := newLease(t, base+"-\x00\xff", 2*time.Second)
	evicted := newLease(t, base+"-evicted", time.Minute)
	taken := newLease(t, base+"-taken", 50*time.Millisecond)
	sem := newLease(t, base+"-sem", 2*time.Second)
	sem.Kind, sem.Limit = backend.KindSemaphore, 2
	for _, l := range []*backend.Lease{live1, live2, odd, evicted, taken, sem} {
		mustAcquire(t, r, l)
	}
	if err := f.evict(t.Context(), evicted.Key); err != nil {
		t.Fatal(err)
	}
	waitExpired(t, f, taken.Key)
	thief := newLease(t, taken.Key, time.Minute)
	mustAcquire(t, other, thief)
	ls := []*backend.Lease{live1, evicted, odd, taken, sem, live2}
	for _, l := range ls {
		l.TTL = time.Minute
	}
	errs := br.RefreshAll(t.Context(), ls)
	want := []bool{true, false, true, false, true, true}
	if len(errs) != len(ls) {
		t.Fatalf("RefreshAll returned %d results for %d leases", len(errs), len(ls))
	}
	for i, l := range ls {
		switch {
		case want[i] && errs[i] != nil:
			t.Errorf("RefreshAll: lease %d (%q) = %v; want nil", i, l.Key, errs[i])
		case !want[i] && !errors.Is(errs[i], backend.ErrNotHeld):
			t.Errorf("RefreshAll: lease %d (%q) = %v; want ErrNotHeld", i, l.Key, errs[i])
		}
	}
	if left, err := f.remaining(t.Context(), live1.Key); err != nil || left < 30*time.Second {
		t.Errorf("after RefreshAll to 1min, %q has %v left (err %v)", live1.Key, left, err)
	}
	if left, err := f.remaining(t.Context(), thief.Key); err != nil || left > time.Minute {
		t.Errorf("the thief's lease of %q: %v left (err %v)", thief.Key, left, err)
	}
	for _, l := range []*backend.Lease{live1, live2, odd, sem} {
		if err := r.Release(t.Context(), l); err != nil {
			t.Errorf("Release(%q): %v", l.Key, err)
		}
	}
	if err := other.Release(t.Context(), thief); err != nil {
		t.Error(err)
	}
}

// testCancelledWriterLeavesNoIntent abandons a writer's attempt whose
// statement waits on the server (another session locks the kinds table)
// while a reader holds, and lets the statement go on: on MariaDB it runs
// and records the writer's intent; on PostgreSQL the cancel request stops
// it. Either way the Cleanup must leave only the reader.
func testCancelledWriterLeavesNoIntent(t *testing.T, f fixture) {
	a, b := f.newResource(t), f.newResource(t)
	key := testsuite.Key(t)
	rd := newLease(t, key, time.Minute)
	rd.Kind = backend.KindRead
	mustAcquire(t, a, rd)
	before, err := f.rows(t.Context(), key)
	if err != nil {
		t.Fatal(err)
	}
	resume := f.lockTable(t, DefaultTable+kindsSuffix)
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	w := newLease(t, key, time.Minute)
	w.Kind = backend.KindWrite
	done := make(chan error, 1)
	go func() {
		_, _, err := b.TryAcquire(ctx, w)
		done <- err
	}()
	eventually(t, 10*time.Second, "the writer's statement waits on the server", func() (bool, error) {
		n, err := f.acquiresWaiting(context.Background(), DefaultTable+kindsSuffix)
		return n > 0, err
	})
	cancel()
	var ab *backend.AbandonedError
	if err := <-done; !errors.As(err, &ab) {
		t.Fatalf("TryAcquire cancelled mid-statement = %v; want an AbandonedError", err)
	}
	resume()
	cctx, ccancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer ccancel()
	if err := ab.Cleanup(cctx); err != nil {
		t.Fatalf("Cleanup: %v", err)
	}
	if after, err := f.rows(t.Context(), key); err != nil || !slices.Equal(after, before) {
		t.Errorf("rows after the abandoned writer's clean-up: %q (err %v); want only the reader's %q", after, err, before)
	}
	if err := a.Release(t.Context(), rd); err != nil {
		t.Fatal(err)
	}
	wantRows(t, f, key)
}
