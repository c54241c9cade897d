package distlock_test

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/distlock/distlock"
	"github.com/distlock/distlock/backend/memory"
)

// The README's example: lock a key, use the fencing token, unlock.
func Example() {
	ctx := context.Background()
	d, err := distlock.New(memory.New(), distlock.WithDefaultTTL(10*time.Second))
	if err != nil {
		panic(err)
	}
	defer d.Close()

	lk, err := d.TryLock(ctx, "order:42", 3*time.Second)
	if errors.Is(err, distlock.ErrNotAcquired) {
		fmt.Println("someone else holds order:42")
		return
	}
	if err != nil {
		panic(err) // the store failed
	}
	fmt.Println("holding", lk.Key(), "with token", lk.Token())
	if err := lk.Unlock(ctx); err != nil {
		fmt.Println("lost it before the end:", err)
	}
	// Output: holding order:42 with token 1
}

func ExampleDistributeLock_Do() {
	d, _ := distlock.New(memory.New())
	defer d.Close()
	err := d.Do(context.Background(), "report:daily", time.Second, func(ctx context.Context, lk *distlock.Lock) error {
		// ctx is cancelled if the lock is lost; pass lk.Token() to the store you write.
		fmt.Println("building the report under token", lk.Token())
		return nil
	})
	fmt.Println("err:", err)
	// Output:
	// building the report under token 1
	// err: <nil>
}

// A TTL for one call rides in the context.
func ExampleContextWithTTL() {
	store := memory.New()
	a, _ := distlock.New(store)
	b, _ := distlock.New(store)
	ctx := context.Background()

	_, _ = a.TryLock(distlock.ContextWithTTL(ctx, 50*time.Millisecond), "job", 0) // never unlocked: a crashed holder
	_, err := b.TryLock(ctx, "job", 0)
	fmt.Println("at once:", err)
	lk, err := b.TryLock(ctx, "job", time.Second) // the crashed holder's 50ms run out
	fmt.Println("after the TTL:", err, lk.Token())
	// Output:
	// at once: distlock: not acquired
	// after the TTL: <nil> 2
}

// Reentrancy follows the context: code that holds a key and passes its
// context down can lock the key again without waiting on itself.
func ExampleContextWithLock() {
	d, _ := distlock.New(memory.New())
	ctx := context.Background()

	transfer := func(ctx context.Context) error {
		// Takes the account lock itself, so it is safe to call alone too.
		return d.Do(ctx, "account:7", time.Second, func(ctx context.Context, lk *distlock.Lock) error {
			fmt.Println("transfer under token", lk.Token())
			return nil
		})
	}
	_ = d.Do(ctx, "account:7", time.Second, func(ctx context.Context, lk *distlock.Lock) error {
		fmt.Println("audit under token", lk.Token())
		return transfer(ctx) // reenters: same lock, no store call, no deadlock
	})
	// Output:
	// audit under token 1
	// transfer under token 1
}

// At most 2 exports run at once, across every process sharing the store;
// each permit is a lock of its own, with its own token.
func ExampleSemaphore() {
	ctx := context.Background()
	d, _ := distlock.New(memory.New())
	defer d.Close()
	exports := d.Semaphore("export", 2)
	a, _ := exports.TryAcquire(ctx, 0)
	b, _ := exports.TryAcquire(ctx, 0)
	_, err := exports.TryAcquire(ctx, 0) // a third must wait for a permit
	fmt.Println(a.Token() < b.Token(), errors.Is(err, distlock.ErrNotAcquired))
	a.Unlock(ctx)
	c, _ := exports.TryAcquire(ctx, 0)
	fmt.Println(c.Token() > b.Token())
	b.Unlock(ctx)
	c.Unlock(ctx)
	// Output:
	// true true
	// true
}

// Many readers of the config, or one writer. A writer that waits keeps
// new readers out, so a stream of readers cannot starve it; its token is
// larger than every reader's before it.
func ExampleRWMutex() {
	ctx := context.Background()
	d, _ := distlock.New(memory.New())
	defer d.Close()
	config := d.RWMutex("config")
	r1, _ := config.TryRLock(ctx, 0)
	r2, _ := config.TryRLock(ctx, 0)
	_, err := config.TryLock(ctx, 0) // a writer waits for the readers
	fmt.Println("writer:", errors.Is(err, distlock.ErrNotAcquired))
	r1.Unlock(ctx)
	r2.Unlock(ctx)
	err = config.Do(ctx, time.Second, func(ctx context.Context, w *distlock.Lock) error {
		fmt.Println("writing with token above the readers':", w.Token() > r2.Token())
		return nil
	})
	fmt.Println(err)
	// Output:
	// writer: true
	// writing with token above the readers': true
	// <nil>
}

// Extend a lock by hand, and read when it ends.
func ExampleLock_Extend() {
	ctx := context.Background()
	d, _ := distlock.New(memory.New())
	defer d.Close()
	lk, _ := d.TryLock(distlock.ContextWithTTL(ctx, time.Second), "job", 0)
	before := lk.Deadline()
	if err := lk.Extend(ctx, time.Minute); err != nil {
		fmt.Println("lost:", err)
	}
	fmt.Println(lk.Deadline().Sub(before) > 50*time.Second)
	lk.Unlock(ctx)
	// Output: true
}

// Who holds a key, without taking it: the holder's token, time left and
// label.
func ExampleDistributeLock_Inspect() {
	ctx := context.Background()
	store := memory.New()
	worker, _ := distlock.New(store, distlock.WithLabel("worker-7"))
	defer worker.Close()
	admin, _ := distlock.New(store)
	defer admin.Close()
	lk, _ := worker.TryLock(ctx, "shard:3", 0)
	info, _ := admin.Inspect(ctx, "shard:3")
	fmt.Println(info.Held(), info.Holders[0].Label, info.Holders[0].Token == lk.Token())
	lk.Unlock(ctx)
	info, _ = admin.Inspect(ctx, "shard:3")
	fmt.Println(info.Held())
	// Output:
	// true worker-7 true
	// false
}

// Several keys, all or none, in one wait; any order of keys is safe.
func ExampleDistributeLock_TryLockAll() {
	ctx := context.Background()
	d, _ := distlock.New(memory.New())
	defer d.Close()
	lk, err := d.TryLockAll(ctx, []string{"account:9", "account:2"}, time.Second)
	if err != nil {
		panic(err)
	}
	fmt.Println(lk.Keys(), len(lk.Tokens()))
	lk.Unlock(ctx)
	// Output: [account:2 account:9] 2
}

// Block until the lock is free or the context ends.
func ExampleWaitForever() {
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	store := memory.New()
	a, _ := distlock.New(store)
	defer a.Close()
	b, _ := distlock.New(store)
	defer b.Close()
	lk, _ := a.TryLock(ctx, "k", 0)
	defer lk.Unlock(context.Background())
	_, err := b.TryLock(ctx, "k", distlock.WaitForever)
	fmt.Println(errors.Is(err, distlock.ErrNotAcquired), errors.Is(err, context.DeadlineExceeded))
	// Output: true true
}

// Two replicas campaign in the election "compactor": one leads, with a
// term that fences its writes; the other reads who leads, and is elected
// when the leader resigns.
func ExampleElection() {
	ctx := context.Background()
	store := memory.New() // any store: one per process over Redis, etcd, ...
	a, _ := distlock.New(store, distlock.WithLabel("host-a"), distlock.WithAutoRenew())
	b, _ := distlock.New(store, distlock.WithLabel("host-b"), distlock.WithAutoRenew())
	defer a.Close()
	defer b.Close()

	lead, err := a.Election("compactor").Campaign(ctx, "http://host-a:8080")
	if err != nil {
		panic(err)
	}
	l, _ := b.Election("compactor").Leader(ctx)
	fmt.Printf("leader %s (%s), term %d\n", l.Label, l.Value, l.Term)

	elected := make(chan *distlock.Lock)
	go func() {
		next, err := b.Election("compactor").Campaign(ctx, "http://host-b:8080")
		if err != nil {
			panic(err)
		}
		elected <- next
	}()
	_ = lead.Unlock(ctx) // resign: the candidate is elected at once
	next := <-elected
	fmt.Println("host-b elected, term", next.Token())
	_ = next.Unlock(ctx)
	// Output:
	// leader host-a (http://host-a:8080), term 1
	// host-b elected, term 2
}

// Run runs the compaction while this replica leads, cancels it when the
// leadership is lost, and campaigns again, until its context ends.
func ExampleElection_Run() {
	d, _ := distlock.New(memory.New(), distlock.WithAutoRenew())
	defer d.Close()
	ctx, stop := context.WithTimeout(context.Background(), time.Second)
	defer stop()
	err := d.Election("compactor").Run(ctx, "host-a", func(ctx context.Context, lead *distlock.Lock) error {
		fmt.Println("compacting as leader of term", lead.Token())
		<-ctx.Done() // work until the leadership is lost or Run's ctx ends
		return nil
	}, distlock.OnStopped(func(lead *distlock.Lock, err error) { fmt.Println("resigned term", lead.Token()) }))
	fmt.Println("Run:", err)
	// Output:
	// compacting as leader of term 1
	// resigned term 1
	// Run: context deadline exceeded
}
