//go:build unix

package main

import (
	"fmt"
	"io"
	"log"

	"github.com/go-sql-driver/mysql"
	goredis "github.com/redis/go-redis/v9"
	"github.com/redis/go-redis/v9/logging"

	"github.com/distlock/distlock/backend"
	"github.com/distlock/distlock/internal/stores"
)

// store is a parsed --store URL: parseStore and its ValidateKey do no
// I/O; Open connects.
type store = stores.Store

// storeOptions are the flags that name where a store keeps its locks
// (--prefix, --table), so that a job and a Go program configured alike
// share them.
type storeOptions = stores.Options

// parseStore parses a --store URL, with the options o. Every error is the
// user's: a bad URL, an unknown scheme, an option the store's client
// refuses or the store does not take.
func parseStore(raw string, o storeOptions) (store, error) { return stores.Parse(raw, o) }

// supports reports, with no I/O, whether s holds locks of kind and, with
// inspect, whether it can tell who holds them: nil, or an error that says
// why not. The facade checks the same before I/O (ErrUnsupported); asking
// first keeps distlock from connecting at all.
func supports(s store, kind backend.Kind, inspect bool) error {
	res := s.Proto()
	if kind != backend.KindMutex && kind != backend.KindElection { // an election is a mutex to the store
		kc, ok := res.(backend.KindChecker)
		if !ok {
			return fmt.Errorf("store %s holds mutexes only, not a %s (distlock.ErrUnsupported)", s, kindName(kind))
		}
		if err := kc.CheckKind(kind); err != nil {
			return fmt.Errorf("store %s cannot hold a %s: %w", s, kindName(kind), err)
		}
	}
	if _, ok := res.(backend.Inspector); inspect && !ok {
		return fmt.Errorf("store %s cannot tell who holds a lock (distlock.ErrUnsupported)", s)
	}
	return nil
}

// kindName names a kind of lock for messages: "mutex", "semaphore", and
// "read/write lock" for both sides of a read/write lock.
func kindName(kind backend.Kind) string {
	if kind == backend.KindRead || kind == backend.KindWrite {
		return "read/write lock"
	}
	return kind.String()
}

func init() {
	// The clients log failed dials and broken connections on stderr;
	// distlock reports the errors that matter itself.
	_ = mysql.SetLogger(log.New(io.Discard, "", 0))
	goredis.SetLogger(&logging.VoidLogger{})
}
