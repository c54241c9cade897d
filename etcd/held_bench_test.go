package etcd

import (
	"testing"

	"github.com/distlock/distlock/internal/testserver"
	"github.com/distlock/distlock/testsuite"
)

// BenchmarkHeld: testsuite.BenchmarkHeld on etcd (heap-B/lock).
//
//	go test -run '^$' -bench Held -benchtime 10000x ./etcd
func BenchmarkHeld(b *testing.B) {
	testsuite.BenchmarkHeld(b, newResource(b, testserver.Etcd(b).Endpoints))
}
