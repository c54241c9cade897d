package redis_test

import (
	"bytes"
	"context"
	"errors"
	"net"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/distlock/distlock/backend"
	"github.com/distlock/distlock/internal/redisscript"
	"github.com/distlock/distlock/internal/testserver"
	"github.com/distlock/distlock/internal/testserver/proxy"
	"github.com/distlock/distlock/redis"
)

// loseReply is a go-redis hook that lets the next script call (EVALSHA or EVAL) run on the server
// and then reports a timeout, as if its reply were lost on the way back: a
// fault a real server cannot be asked to give.
type loseReply struct{ armed atomic.Bool }

func (h *loseReply) DialHook(next goredis.DialHook) goredis.DialHook { return next }
func (h *loseReply) ProcessPipelineHook(next goredis.ProcessPipelineHook) goredis.ProcessPipelineHook {
	return next
}
func (h *loseReply) ProcessHook(next goredis.ProcessHook) goredis.ProcessHook {
	return func(ctx context.Context, cmd goredis.Cmder) error {
		err := next(ctx, cmd)
		if err == nil && (cmd.Name() == "evalsha" || cmd.Name() == "eval") && h.armed.CompareAndSwap(true, false) {
			err = &net.OpError{Op: "read", Net: "tcp", Err: context.DeadlineExceeded}
			cmd.SetErr(err)
		}
		return err
	}
}

// TestLostAcquireReplyCleansUp: the acquire ran on the server but its reply
// was lost; TryAcquire must return the error and leave no lock behind.
func TestLostAcquireReplyCleansUp(t *testing.T) {
	c := standalone(t)
	hook := &loseReply{}
	c.AddHook(hook)
	r := newResource(t, c)
	ctx := t.Context()
	key := uniqueKey(t)
	lock, fence := redisscript.Layout(redis.DefaultPrefix, key)

	hook.armed.Store(true)
	l := newLease(key, time.Minute)
	ok, _, err := r.TryAcquire(ctx, l)
	if ok || err == nil {
		t.Fatalf("TryAcquire with a lost reply = %v, %v; want an error", ok, err)
	}
	if !strings.Contains(err.Error(), `redis: acquire "`+key+`"`) {
		t.Errorf("error %q does not name the op and key", err)
	}
	if n, _ := c.Get(ctx, fence).Int64(); n == 0 {
		t.Fatalf("no fence; want one (the script must have run)")
	}
	if exists(t, c, lock) {
		t.Errorf("lock %q left behind after a lost reply", lock)
	}
	// The next owner is not blocked for the TTL.
	mustAcquire(t, r, newLease(key, time.Minute))
}

// holdRequest is a go-redis hook that keeps the next script call (EVALSHA
// or EVAL) from the server and reports a timeout, keeping its arguments:
// the test sends them later, as a request delayed on the network that
// reaches Redis after its sender gave up and cleaned up. A fault a real
// server cannot be asked to give.
type holdRequest struct {
	armed atomic.Bool
	held  []any
}

func (h *holdRequest) DialHook(next goredis.DialHook) goredis.DialHook { return next }
func (h *holdRequest) ProcessPipelineHook(next goredis.ProcessPipelineHook) goredis.ProcessPipelineHook {
	return next
}
func (h *holdRequest) ProcessHook(next goredis.ProcessHook) goredis.ProcessHook {
	return func(ctx context.Context, cmd goredis.Cmder) error {
		if (cmd.Name() == "evalsha" || cmd.Name() == "eval") && h.armed.CompareAndSwap(true, false) {
			h.held = cmd.Args()
			err := &net.OpError{Op: "read", Net: "tcp", Err: context.DeadlineExceeded}
			cmd.SetErr(err)
			return err
		}
		return next(ctx, cmd)
	}
}

// TestDelayedAcquireAfterCleanup: the acquire request reaches Redis only
// after TryAcquire gave up and cleaned up. The clean-up's tombstone must
// make it set nothing, so the next owner is not blocked for the TTL.
func TestDelayedAcquireAfterCleanup(t *testing.T) {
	deployments(t, func(t *testing.T, c goredis.UniversalClient) {
		hook := &holdRequest{}
		c.AddHook(hook)
		r := newResource(t, c)
		ctx := t.Context()
		key := uniqueKey(t)
		lock, fence := redisscript.Layout(redis.DefaultPrefix, key)
		// The held EVALSHA must find the script when it is sent.
		if err := redisscript.Acquire.Load(ctx, c).Err(); err != nil {
			t.Fatalf("SCRIPT LOAD: %v", err)
		}

		hook.armed.Store(true)
		l := newLease(key, time.Minute)
		ok, _, err := r.TryAcquire(ctx, l)
		if ok || err == nil || hook.held == nil {
			t.Fatalf("TryAcquire with its request held = %v, %v (held %v); want an error", ok, err, hook.held != nil)
		}
		dead := redisscript.DeadKey(lock, l.Value)
		ttl, err := c.PTTL(ctx, dead).Result()
		if err != nil || ttl <= 0 || ttl > l.TTL {
			t.Fatalf("tombstone %q PTTL = %v, %v; want in (0, %v]", dead, ttl, err, l.TTL)
		}

		// The request arrives now.
		err = c.Do(ctx, hook.held...).Err()
		if !redisscript.IsDead(err) {
			t.Errorf("late acquire = %v; want the DEAD error", err)
		}
		if exists(t, c, lock) {
			t.Fatalf("late acquire left lock %q behind", lock)
		}
		if n, err := c.Get(ctx, fence).Int64(); n != 0 || !errors.Is(err, goredis.Nil) {
			t.Errorf("fence = %d, %v; want none (the late acquire must not take a token)", n, err)
		}
		next := newLease(key, time.Minute)
		mustAcquire(t, r, next)
		// Once another owner holds the key, the late request is refused as
		// contention and leaves the holder alone.
		if v, err := c.Do(ctx, hook.held...).Int64(); err != nil || v >= 0 {
			t.Errorf("late acquire while held = %d, %v; want the holder's negative PTTL", v, err)
		}
		// (The refused request marks the lock as waited for: the value
		// with redisscript.WaitedMark.)
		if got, _ := c.Get(ctx, lock).Result(); strings.TrimSuffix(got, redisscript.WaitedMark) != next.Value {
			t.Errorf("lock holds %q; want the holder's %q", got, next.Value)
		}
		if err := r.Release(ctx, next); err != nil {
			t.Errorf("Release = %v", err)
		}
	})
}

// TestWaitReplicas runs the acquire with WAIT against a master with one
// real replica.
func TestWaitReplicas(t *testing.T) {
	masterSrv := testserver.Redis(t)
	replicaSrv := testserver.RedisReplica(t, masterSrv)
	master := goredis.NewClient(&goredis.Options{Addr: masterSrv.Addr})
	replica := goredis.NewClient(&goredis.Options{Addr: replicaSrv.Addr})
	t.Cleanup(func() { _ = master.Close(); _ = replica.Close() })
	ctx := t.Context()

	t.Run("enough", func(t *testing.T) {
		r := newResource(t, master, redis.WithWaitReplicas(1, 2*time.Second))
		l := newLease(uniqueKey(t), time.Minute)
		mustAcquire(t, r, l)
		lock, _ := redisscript.Layout(redis.DefaultPrefix, l.Key)
		if got, err := replica.Get(ctx, lock).Result(); err != nil || got != l.Value {
			t.Errorf("replica has %q, %v right after the acquire; want %q", got, err, l.Value)
		}
		// Contention still reports the holder, with no error.
		ok, ttl, err := r.TryAcquire(ctx, newLease(l.Key, time.Minute))
		if ok || err != nil || ttl <= 0 {
			t.Errorf("contended TryAcquire = %v, %v, %v; want false, > 0, nil", ok, ttl, err)
		}
		if err := r.Release(ctx, l); err != nil {
			t.Errorf("Release = %v", err)
		}
	})

	t.Run("too-few", func(t *testing.T) {
		r := newResource(t, master, redis.WithWaitReplicas(2, 50*time.Millisecond))
		l := newLease(uniqueKey(t), time.Minute)
		ok, _, err := r.TryAcquire(ctx, l)
		if ok || !errors.Is(err, redis.ErrNotReplicated) {
			t.Fatalf("TryAcquire = %v, %v; want ErrNotReplicated", ok, err)
		}
		if !strings.Contains(err.Error(), "1 of 2") {
			t.Errorf("error %q does not say how many acknowledged", err)
		}
		lock, _ := redisscript.Layout(redis.DefaultPrefix, l.Key)
		if exists(t, master, lock) {
			t.Errorf("unreplicated lock %q left behind", lock)
		}
	})
}

// TestReleaseWhenPublishDenied: the release notice is a hint. With PUBLISH
// denied by an ACL (as SPUBLISH is missing before Redis 7.0) the
// compare-and-delete still succeeds.
func TestReleaseWhenPublishDenied(t *testing.T) {
	admin := standalone(t)
	ctx := t.Context()
	user := "nopub-" + uniqueKey(t)
	if err := admin.Do(ctx, "ACL", "SETUSER", user, "on", ">pw", "~*", "&*", "+@all", "-publish").Err(); err != nil {
		t.Fatalf("ACL SETUSER: %v", err)
	}
	c := goredis.NewClient(&goredis.Options{Addr: admin.Options().Addr, Username: user, Password: "pw"})
	t.Cleanup(func() { _ = c.Close() })
	if err := c.Publish(ctx, "x", "").Err(); err == nil || !strings.Contains(err.Error(), "NOPERM") {
		t.Fatalf("PUBLISH as %s = %v; want NOPERM", user, err)
	}
	r := newResource(t, c)
	l := newLease(uniqueKey(t), time.Minute)
	mustAcquire(t, r, l)
	// A refused attempt, so that the release sends its notice.
	if ok, _, err := r.TryAcquire(ctx, newLease(l.Key, time.Minute)); ok || err != nil {
		t.Fatalf("TryAcquire of a held lock = %v, %v; want false, nil", ok, err)
	}
	before := commandRejections(t, admin)
	if err := r.Release(ctx, l); err != nil {
		t.Fatalf("Release with PUBLISH denied = %v; want nil", err)
	}
	if d := statsDelta(before, commandRejections(t, admin)); d["publish.rejected"] != 1 {
		t.Errorf("rejected calls during the release: %v; want its PUBLISH refused once", d)
	}
	lock, _ := redisscript.Layout(redis.DefaultPrefix, l.Key)
	if exists(t, admin, lock) {
		t.Errorf("lock %q not deleted", lock)
	}
}

// TestFailoverAfterWait: a lock taken with WithWaitReplicas(1, ...) is on
// the replica when the master dies, so after promotion the lock still
// excludes others and the next token is still larger.
func TestFailoverAfterWait(t *testing.T) {
	masterSrv := testserver.Redis(t)
	replicaSrv := testserver.RedisReplica(t, masterSrv)
	master := goredis.NewClient(&goredis.Options{Addr: masterSrv.Addr})
	promoted := goredis.NewClient(&goredis.Options{Addr: replicaSrv.Addr})
	t.Cleanup(func() { _ = master.Close(); _ = promoted.Close() })
	ctx := t.Context()

	r := newResource(t, master, redis.WithWaitReplicas(1, 2*time.Second))
	held := newLease(uniqueKey(t), time.Minute)
	mustAcquire(t, r, held)

	masterSrv.Kill()
	replicaSrv.Promote()

	after := newResource(t, promoted)
	ok, _, err := after.TryAcquire(ctx, newLease(held.Key, time.Minute))
	if ok || err != nil {
		t.Fatalf("TryAcquire on the promoted replica = %v, %v; want false, nil (the lock was replicated)", ok, err)
	}
	if err := after.Release(ctx, held); err != nil {
		t.Fatalf("Release on the promoted replica = %v", err)
	}
	next := newLease(held.Key, time.Minute)
	mustAcquire(t, after, next)
	if next.Token <= held.Token {
		t.Errorf("token after failover %d; want > %d", next.Token, held.Token)
	}
}

// dialCount counts the connections a client opens.
type dialCount struct{ n atomic.Int32 }

func (h *dialCount) DialHook(next goredis.DialHook) goredis.DialHook {
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		h.n.Add(1)
		return next(ctx, network, addr)
	}
}
func (h *dialCount) ProcessHook(next goredis.ProcessHook) goredis.ProcessHook { return next }
func (h *dialCount) ProcessPipelineHook(next goredis.ProcessPipelineHook) goredis.ProcessPipelineHook {
	return next
}

// busyScript keeps the Redis server busy (it runs one script at a time and
// serves nobody meanwhile) for ARGV[1] microseconds.
var busyScript = goredis.NewScript(`
local t = redis.call('TIME')
local start = t[1] * 1000000 + t[2]
repeat
  t = redis.call('TIME')
until t[1] * 1000000 + t[2] - start >= tonumber(ARGV[1])
return 1`)

// TestResentAcquireTakesItsOwnLock: go-redis resends a command whose reply
// did not come within ReadTimeout. Here the server is busy, so the first
// acquire request times out unanswered and is resent; when the server is
// free it runs both, and the first takes the lock. The resent one must
// report the lock acquired (it holds the attempt's own value), not held by
// another owner: that would fail the acquisition and leave the lock to
// expire unowned.
func TestResentAcquireTakesItsOwnLock(t *testing.T) {
	srv := testserver.Redis(t)
	const (
		busy        = 1500 * time.Millisecond // the server serves nobody
		readTimeout = 800 * time.Millisecond  // < busy: the first request times out
	)
	dials := &dialCount{}
	c := goredis.NewClient(&goredis.Options{Addr: srv.Addr, ReadTimeout: readTimeout, MaxRetries: 1,
		MinRetryBackoff: time.Millisecond, MaxRetryBackoff: time.Millisecond})
	t.Cleanup(func() { _ = c.Close() })
	c.AddHook(dials)
	r := newResource(t, c)
	ctx := t.Context()
	key := uniqueKey(t)
	lock, fence := redisscript.Layout(redis.DefaultPrefix, key)
	if err := redisscript.Acquire.Load(ctx, c).Err(); err != nil {
		t.Fatalf("SCRIPT LOAD: %v", err)
	}
	if err := busyScript.Load(ctx, c).Err(); err != nil {
		t.Fatalf("SCRIPT LOAD: %v", err)
	}
	dialed := dials.n.Load()
	// A fence an hour ahead of the server's clock: each run of the
	// acquire script then adds exactly 1 (the hybrid clock's last + 1).
	ahead := uint64(time.Now().Add(time.Hour).UnixMicro())
	if err := c.Set(ctx, fence, ahead, 0).Err(); err != nil {
		t.Fatal(err)
	}

	other := goredis.NewClient(&goredis.Options{Addr: srv.Addr, ReadTimeout: 2 * busy})
	t.Cleanup(func() { _ = other.Close() })
	probe := goredis.NewClient(&goredis.Options{Addr: srv.Addr, ReadTimeout: 20 * time.Millisecond, MaxRetries: -1})
	t.Cleanup(func() { _ = probe.Close() })
	if err := probe.Ping(ctx).Err(); err != nil {
		t.Fatalf("PING: %v", err)
	}
	busyDone := make(chan error, 1)
	started := time.Now()
	go func() { busyDone <- busyScript.Run(ctx, other, nil, busy.Microseconds()).Err() }()
	// The server is busy once a PING goes unanswered.
	waitFor(t, "the busy script to start", func() bool { return probe.Ping(ctx).Err() != nil })
	if time.Since(started) > busy-readTimeout-100*time.Millisecond {
		t.Fatalf("the server got busy only after %v: too late for the first request to time out", time.Since(started))
	}

	l := newLease(key, time.Minute)
	ok, holder, err := r.TryAcquire(ctx, l)
	if err := <-busyDone; err != nil {
		t.Fatalf("busy script: %v", err)
	}
	if d := dials.n.Load() - dialed; d < 1 {
		t.Fatalf("the client opened no new connection: the acquire was not resent (test setup)")
	}
	n, ferr := c.Get(ctx, fence).Uint64()
	if ferr != nil || n != ahead+2 {
		t.Fatalf("fence = %d, %v; want %d + 2: the first request and its resend both ran", n, ferr, ahead)
	}
	if err != nil || !ok {
		t.Fatalf("TryAcquire over a resent request = %v (holder TTL %v), %v; want acquired", ok, holder, err)
	}
	if l.Token != n {
		t.Errorf("token = %d; want the latest fence value %d", l.Token, n)
	}
	if got, _ := c.Get(ctx, lock).Result(); got != l.Value {
		t.Errorf("lock holds %q; want the attempt's value %q", got, l.Value)
	}
	if err := r.Release(ctx, l); err != nil {
		t.Errorf("Release = %v", err)
	}
	if exists(t, c, lock) {
		t.Errorf("lock %q left behind", lock)
	}
}

// TestLateCopyOfEarlierAttempt: an attempt's request is delayed on the
// network; go-redis resends it after its read timeout, the resend finds
// the lock held by another owner, and the spin loop will try again with
// the same value. The delayed copy then reaches Redis once the lock is
// free and takes it. The next attempt finds its own value and is granted
// the lock: the lock's expiry must then run from that attempt, from whose
// start the holder counts it valid, not from the late copy, which would
// free the key for another owner while this one still holds the lock.
func TestLateCopyOfEarlierAttempt(t *testing.T) {
	srv := testserver.Redis(t)
	p, err := proxy.Start(srv.Addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.Close() })
	c := goredis.NewClient(&goredis.Options{Addr: p.Addr, ReadTimeout: 300 * time.Millisecond, MaxRetries: 1,
		MinRetryBackoff: time.Millisecond, MaxRetryBackoff: time.Millisecond})
	t.Cleanup(func() { _ = c.Close() })
	direct := goredis.NewClient(&goredis.Options{Addr: srv.Addr})
	t.Cleanup(func() { _ = direct.Close() })
	r := newResource(t, c)
	ctx := t.Context()
	key := uniqueKey(t)
	lock, _ := redisscript.Layout(redis.DefaultPrefix, key)
	if err := redisscript.Acquire.Load(ctx, direct).Err(); err != nil {
		t.Fatalf("SCRIPT LOAD: %v", err)
	}
	if err := direct.Set(ctx, lock, "other", time.Minute).Err(); err != nil {
		t.Fatal(err)
	}

	held := p.Hold(proxy.Up, func(b []byte) bool { return bytes.Contains(b, []byte(redisscript.Acquire.Hash())) })
	t.Cleanup(held.Release)
	l := newLease(key, 10*time.Second)
	if ok, _, err := r.TryAcquire(ctx, l); ok || err != nil {
		t.Fatalf("first attempt = %v, %v; want false, nil (its resend found the lock held)", ok, err)
	}
	select {
	case <-held.Seen():
	default:
		t.Fatal("the first copy of the request was not held: the attempt was not resent (test setup)")
	}
	if err := direct.Del(ctx, lock).Err(); err != nil {
		t.Fatal(err)
	}
	held.Release()
	waitFor(t, "the late copy to take the lock", func() bool { return direct.Get(ctx, lock).Val() == l.Value })
	time.Sleep(time.Second) // the late copy's expiry ages

	start := time.Now()
	if ok, _, err := r.TryAcquire(ctx, l); !ok || err != nil {
		t.Fatalf("next attempt = %v, %v; want true, nil (the lock holds its value)", ok, err)
	}
	pttl, err := direct.PTTL(ctx, lock).Result()
	if err != nil {
		t.Fatal(err)
	}
	// The server expires the key at now + pttl (to the millisecond); the
	// holder counts its lock valid until start + TTL.
	if expiry, valid := time.Now().Add(pttl+time.Millisecond), start.Add(l.TTL); expiry.Before(valid) {
		t.Errorf("the server frees the lock %v before the end of the holder's TTL", valid.Sub(expiry))
	}
	if err := r.Release(ctx, l); err != nil {
		t.Errorf("Release = %v", err)
	}
}

// TestReleaseSentAgain: the reply of a Release that deleted
// the key is lost (the connection breaks as it comes back), and go-redis
// sends the release again on a new connection, where it finds the key
// gone: Release must say nil, not ErrNotHeld. A lock that expired, was
// deleted from outside, or expired and was taken and released by another
// owner, still says ErrNotHeld.
func TestReleaseSentAgain(t *testing.T) {
	srv := testserver.Redis(t)
	p, err := proxy.Start(srv.Addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.Close() })
	c := goredis.NewClient(&goredis.Options{Addr: p.Addr, MaxRetries: 3,
		MinRetryBackoff: time.Millisecond, MaxRetryBackoff: time.Millisecond})
	t.Cleanup(func() { _ = c.Close() })
	r := newResource(t, c)
	ctx := t.Context()

	t.Run("ReplyLost", func(t *testing.T) {
		for _, label := range []string{"", "host-1"} {
			key := uniqueKey(t)
			lock, _ := redisscript.Layout(redis.DefaultPrefix, key)
			l := newLease(key, time.Minute)
			l.Label = label
			mustAcquire(t, r, l)
			held := p.Hold(proxy.Down, func(b []byte) bool { return string(b) == ":1\r\n" })
			lost := make(chan struct{})
			go func() {
				select {
				case <-held.Seen():
					p.CloseConns() // the reply is lost with its connection
				case <-ctx.Done():
				}
				close(lost)
			}()
			err := r.Release(ctx, l)
			<-lost
			select {
			case <-held.Seen():
			default:
				t.Fatal("the release's reply was not held: the test proves nothing")
			}
			held.Release()
			if err != nil {
				t.Errorf("label %q: Release whose first reply was lost = %v; want nil (the first run deleted the key)", label, err)
			}
			if exists(t, c, lock) || exists(t, c, lock+redisscript.LabelSuffix) {
				t.Errorf("label %q: the lock or its label is left", label)
			}
		}
	})
	t.Run("Expired", func(t *testing.T) {
		key := uniqueKey(t)
		lock, _ := redisscript.Layout(redis.DefaultPrefix, key)
		l := newLease(key, 50*time.Millisecond)
		mustAcquire(t, r, l)
		waitFor(t, "the lock to expire", func() bool { return !exists(t, c, lock) })
		if err := r.Release(ctx, l); !errors.Is(err, backend.ErrNotHeld) {
			t.Errorf("Release of an expired lock = %v; want ErrNotHeld", err)
		}
	})
	t.Run("DeletedFromOutside", func(t *testing.T) {
		key := uniqueKey(t)
		lock, _ := redisscript.Layout(redis.DefaultPrefix, key)
		l := newLease(key, time.Minute)
		mustAcquire(t, r, l)
		if err := c.Del(ctx, lock).Err(); err != nil {
			t.Fatal(err)
		}
		if err := r.Release(ctx, l); !errors.Is(err, backend.ErrNotHeld) {
			t.Errorf("Release of a lock deleted from outside = %v; want ErrNotHeld", err)
		}
	})
	t.Run("ExpiredTakenReleased", func(t *testing.T) {
		key := uniqueKey(t)
		lock, _ := redisscript.Layout(redis.DefaultPrefix, key)
		l := newLease(key, 50*time.Millisecond)
		mustAcquire(t, r, l)
		waitFor(t, "the lock to expire", func() bool { return !exists(t, c, lock) })
		other := newLease(key, time.Minute)
		mustAcquire(t, r, other)
		if err := r.Release(ctx, other); err != nil {
			t.Fatal(err)
		}
		if err := r.Release(ctx, l); !errors.Is(err, backend.ErrNotHeld) {
			t.Errorf("Release of a lock that expired, then was taken and released = %v; want ErrNotHeld", err)
		}
	})
}
