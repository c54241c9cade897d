package sqldb

import (
	"testing"

	"github.com/distlock/distlock/testsuite"
)

// BenchmarkPostgresHeld: testsuite.BenchmarkHeld on PostgreSQL, the
// facade's heap per held lock with the store's (heap-B/lock; the target
// is at most 300 B).
//
//	go test -run '^$' -bench PostgresHeld -benchtime 100000x ./sqldb
func BenchmarkPostgresHeld(b *testing.B) {
	f := newPG(b)
	testsuite.BenchmarkHeld(b, f.resource(b, f.pool(b, nil)))
}
