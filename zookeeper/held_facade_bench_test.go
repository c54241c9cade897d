package zookeeper

import (
	"testing"

	"github.com/distlock/distlock/internal/testserver"
	"github.com/distlock/distlock/testsuite"
)

// BenchmarkHeldFacade: testsuite.BenchmarkHeld on ZooKeeper, the facade's
// grant and the store's, next to BenchmarkHeld's store alone
// (heap-B/lock).
//
//	go test -run '^$' -bench HeldFacade -benchtime 10000x ./zookeeper
func BenchmarkHeldFacade(b *testing.B) {
	addrs := []string{testserver.ZooKeeper(b).Addr}
	warmUp(b, addrs)
	r, _ := newResource(b, addrs, WithSessionTimeout(sessionTimeout))
	testsuite.BenchmarkHeld(b, r)
}
