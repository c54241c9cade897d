package zookeeper_test

import (
	"context"
	"fmt"
	"log"
	"time"

	"github.com/go-zookeeper/zk"

	"github.com/distlock/distlock"
	"github.com/distlock/distlock/zookeeper"
)

// The caller connects and owns the connection; the resource is told the
// session timeout so that it rides out shorter disconnections.
func Example() {
	const sessionTimeout = 10 * time.Second
	conn, _, err := zk.Connect([]string{"127.0.0.1:2181"}, sessionTimeout)
	if err != nil {
		log.Fatal(err)
	}
	defer conn.Close()

	res, err := zookeeper.New(conn, zookeeper.WithSessionTimeout(sessionTimeout))
	if err != nil {
		log.Fatal(err) // a nil conn or a bad option: wraps distlock.ErrInvalid
	}
	d, err := distlock.New(res, distlock.WithAutoRenew())
	if err != nil {
		log.Fatal(err)
	}
	defer d.Close()

	ctx := context.Background()
	err = d.Do(ctx, "orders/42", 5*time.Second, func(ctx context.Context, lk *distlock.Lock) error {
		// Pass lk.Token() to the store the lock protects; ctx ends if the
		// lock is lost (session expired).
		fmt.Println("holding", lk.Key(), "with token", lk.Token())
		return nil
	})
	if err != nil {
		log.Fatal(err)
	}
}
