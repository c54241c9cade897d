package redis_test

import (
	"context"
	"errors"
	"log"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/distlock/distlock"
	"github.com/distlock/distlock/fence"
	"github.com/distlock/distlock/redis"
)

// Writes to a Redis key fenced by the token of the lock that guards it:
// a holder that lost the lock while paused cannot overwrite a newer
// holder's value. (Compiled, not run: it needs a server.)
func ExampleFence() {
	rdb := goredis.NewClient(&goredis.Options{Addr: "127.0.0.1:6379"})
	defer rdb.Close()
	res, err := redis.New(rdb)
	if err != nil {
		log.Fatal(err)
	}
	locks, err := distlock.New(res)
	if err != nil {
		log.Fatal(err)
	}
	defer locks.Close()
	reports, err := redis.NewFence(rdb) // the resource's Redis may be another one
	if err != nil {
		log.Fatal(err)
	}

	ctx := context.Background()
	err = locks.Do(ctx, "report:daily", time.Second, func(ctx context.Context, lk *distlock.Lock) error {
		// ... build the report ...
		return reports.Set(ctx, "report:daily", lk.Token(), "the report", 24*time.Hour)
	})
	if errors.Is(err, fence.ErrStale) {
		log.Print("a newer holder wrote the report: this one was dropped")
	}
}

// A script of one's own, fenced: it updates two keys of one hash tag
// together, or not at all.
func ExampleNewFencedScript() {
	rdb := goredis.NewClusterClient(&goredis.ClusterOptions{Addrs: []string{"127.0.0.1:7000"}})
	defer rdb.Close()
	move := redis.NewFencedScript(`
redis.call('HINCRBY', KEYS[1], 'balance', -ARGV[1])
redis.call('HINCRBY', KEYS[2], 'balance', ARGV[1])
return 1`)
	accounts, err := redis.NewFence(rdb)
	if err != nil {
		log.Fatal(err)
	}
	var token uint64 // the token of the lock on "{acct:7}"
	err = accounts.Run(context.Background(), move, "{acct:7}:from", token, []string{"{acct:7}:to"}, 10).Err()
	if err != nil {
		log.Print(err) // errors.Is(err, fence.ErrStale), or the server's
	}
}
