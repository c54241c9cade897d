package hotspot_test

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/distlock/distlock"
	"github.com/distlock/distlock/backend/memory"
	"github.com/distlock/distlock/hotspot"
)

// Eight goroutines lock one hot key 5 times each. The local lock lets one
// at a time reach the store, and frees the next one only after the store
// released: every remote attempt succeeds.
func Example() {
	ctx := context.Background()
	met := newCounter()
	hot := hotspot.New("inventory:sku-1")
	d, err := distlock.New(memory.New(), distlock.WithHandlers(met, hot))
	if err != nil {
		panic(err)
	}
	defer d.Close()

	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			for range 5 {
				err := d.Do(ctx, "inventory:sku-1", 5*time.Second, func(context.Context, *distlock.Lock) error {
					return nil // the work the lock protects
				})
				if err != nil {
					panic(err)
				}
			}
		})
	}
	wg.Wait()
	s := met.Stats()
	fmt.Println("hot keys:", hot.Hot())
	fmt.Println("acquired:", s.Acquired, "remote attempts:", s.RemoteAttempts)
	// Output:
	// hot keys: [inventory:sku-1]
	// acquired: 40 remote attempts: 40
}

// With auto-detection, a key is promoted while at least threshold
// goroutines wait for it; here two.
func ExampleWithAutoDetect() {
	hot, err := hotspot.NewWithOptions(
		hotspot.WithKeys("always-hot"),
		hotspot.WithAutoDetect(2, 128), // promote at 2 waiters, keep at most 128
		hotspot.WithIdleAfter(time.Minute),
	)
	if err != nil {
		panic(err)
	}
	d, err := distlock.New(memory.New(), distlock.WithHandlers(hot))
	if err != nil {
		panic(err)
	}
	defer d.Close()
	fmt.Println(hot.Hot())
	// Output:
	// [always-hot]
}
