package etcd_test

import (
	"context"
	"fmt"
	"log"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/distlock/distlock"
	"github.com/distlock/distlock/etcd"
)

// The caller connects and owns the client. Locks the facade renews
// (WithAutoRenew) share one lease per TTL, kept alive by the client, so
// each takes one transaction to acquire and one to release.
func Example() {
	c, err := clientv3.New(clientv3.Config{Endpoints: []string{"127.0.0.1:2379"}, DialTimeout: 5 * time.Second})
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()

	res, err := etcd.New(c)
	if err != nil {
		log.Fatal(err) // a nil client or option: wraps distlock.ErrInvalid
	}
	d, err := distlock.New(res, distlock.WithAutoRenew(), distlock.WithDefaultTTL(10*time.Second))
	if err != nil {
		log.Fatal(err)
	}
	defer d.Close()

	ctx := context.Background()
	err = d.Do(ctx, "orders/42", 5*time.Second, func(ctx context.Context, lk *distlock.Lock) error {
		// Pass lk.Token() (the key's create revision) to the store the
		// lock protects; ctx ends if the lock is lost.
		fmt.Println("holding", lk.Key(), "with token", lk.Token())
		return nil
	})
	if err != nil {
		log.Fatal(err)
	}
}

// Keys under another prefix than the default /distlock/: processes that
// share locks must agree on it.
func ExampleWithPrefix() {
	c, err := clientv3.New(clientv3.Config{Endpoints: []string{"127.0.0.1:2379"}})
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()
	res, err := etcd.New(c, etcd.WithPrefix("/billing/locks/"))
	if err != nil {
		log.Fatal(err)
	}
	defer res.Close()
}
