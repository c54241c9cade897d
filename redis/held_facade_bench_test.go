package redis_test

import (
	"testing"

	"github.com/distlock/distlock/testsuite"
)

// BenchmarkHeldFacade: testsuite.BenchmarkHeld on Redis, the facade's
// heap per held lock with the store's (heap-B/lock; the target is at
// most 300 B). BenchmarkHeld counts the store's part alone.
//
//	go test -run '^$' -bench HeldFacade -benchtime 100000x ./redis
func BenchmarkHeldFacade(b *testing.B) {
	r := mustNew(b, standalone(b))
	defer r.Close()
	testsuite.BenchmarkHeld(b, r)
}
