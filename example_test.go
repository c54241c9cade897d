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
