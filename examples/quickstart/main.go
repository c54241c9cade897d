// Command quickstart shows distlock on its embedded in-process store: three
// simulated instances, four goroutines each, contend for one key. It prints
// who held the key with which fencing token, and checks that a counter the
// lock guards equals the number of acquisitions.
//
//	go run ./examples/quickstart
package main

import (
	"context"
	"errors"
	"fmt"
	"log"
	"sync"
	"time"

	"github.com/distlock/distlock"
	"github.com/distlock/distlock/backend/memory"
)

func main() {
	if err := run(context.Background()); err != nil {
		log.Fatal(err)
	}
}

func run(ctx context.Context) error {
	const instances, workers, rounds = 3, 4, 3
	store := memory.New() // one "server" shared by the instances

	var (
		mu        sync.Mutex
		counter   int // guarded by the distributed lock, not by mu
		acquired  int
		lastToken uint64
		wg        sync.WaitGroup
		errs      = make(chan error, instances*workers)
	)
	for i := range instances {
		d, err := distlock.New(store, distlock.WithDefaultTTL(5*time.Second))
		if err != nil {
			return err
		}
		defer d.Close()
		for w := range workers {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for range rounds {
					err := d.Do(ctx, "inventory:sku-42", 2*time.Second, func(ctx context.Context, lk *distlock.Lock) error {
						v := counter // read-modify-write that only the lock makes safe
						time.Sleep(time.Millisecond)
						counter = v + 1

						mu.Lock()
						defer mu.Unlock()
						acquired++
						if lk.Token() <= lastToken {
							return fmt.Errorf("token %d not above %d", lk.Token(), lastToken)
						}
						lastToken = lk.Token()
						fmt.Printf("instance %d worker %d holds %s with token %d\n", i, w, lk.Key(), lk.Token())
						return nil
					})
					if errors.Is(err, distlock.ErrNotAcquired) {
						fmt.Printf("instance %d worker %d gave up waiting\n", i, w)
						continue
					}
					if err != nil {
						errs <- err
						return
					}
				}
			}()
		}
	}
	wg.Wait()
	close(errs)
	if err := <-errs; err != nil {
		return err
	}
	fmt.Printf("\n%d acquisitions, guarded counter = %d, last token = %d\n", acquired, counter, lastToken)
	if counter != acquired {
		return fmt.Errorf("the counter lost increments: %d != %d", counter, acquired)
	}
	fmt.Println("OK: the counter equals the acquisitions; tokens only went up")
	return nil
}
