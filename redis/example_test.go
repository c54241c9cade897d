package redis_test

import (
	"context"
	"log"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/distlock/distlock"
	"github.com/distlock/distlock/redis"
)

// A lock on a standalone Redis (or a Sentinel master: use
// goredis.NewFailoverClient). The token goes with every write to the
// protected resource, which refuses tokens lower than the highest it saw.
func ExampleNew() {
	rdb := goredis.NewClient(&goredis.Options{Addr: "127.0.0.1:6379"})
	defer rdb.Close() // the caller owns the client

	res, err := redis.New(rdb)
	if err != nil {
		log.Fatal(err)
	}
	locks, err := distlock.New(res, distlock.WithDefaultTTL(10*time.Second))
	if err != nil {
		log.Fatal(err)
	}
	defer locks.Close()

	ctx := context.Background()
	lk, err := locks.TryLock(ctx, "invoice:42", 5*time.Second)
	if err != nil {
		log.Fatal(err)
	}
	defer lk.Unlock(ctx)
	log.Printf("writing with fencing token %d", lk.Token())
}

// On Redis Cluster, a lock and its fence share a slot, and the
// release notice uses sharded pub/sub.
func ExampleNew_cluster() {
	rdb := goredis.NewClusterClient(&goredis.ClusterOptions{
		Addrs: []string{"127.0.0.1:7000", "127.0.0.1:7001", "127.0.0.1:7002"},
	})
	defer rdb.Close()
	res, err := redis.New(rdb, redis.WithPrefix("billing:"))
	if err != nil {
		log.Fatal(err)
	}
	locks, err := distlock.New(res)
	if err != nil {
		log.Fatal(err)
	}
	defer locks.Close()
}

// With replicas, wait until one acknowledged each lock before using it.
func ExampleWithWaitReplicas() {
	rdb := goredis.NewFailoverClient(&goredis.FailoverOptions{
		MasterName:    "mymaster",
		SentinelAddrs: []string{"127.0.0.1:26379"},
	})
	defer rdb.Close()
	res, err := redis.New(rdb, redis.WithWaitReplicas(1, 100*time.Millisecond))
	if err != nil {
		log.Fatal(err)
	}
	defer res.Close()
}
