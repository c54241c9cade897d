package hotspot_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/distlock/distlock"
	"github.com/distlock/distlock/backend/memory"
	"github.com/distlock/distlock/hotspot"
)

// BenchmarkContended locks one key from GOMAXPROCS*4 goroutines on the
// memory store, each holding it 50µs, with and without a hotspot handler,
// and reports remote attempts per acquisition.
func BenchmarkContended(b *testing.B) {
	for _, hot := range []bool{false, true} {
		b.Run(fmt.Sprintf("hotspot=%v", hot), func(b *testing.B) {
			key := "bench"
			met := newCounter()
			hs := []distlock.Handler{met}
			if hot {
				hs = append(hs, hotspot.New(key))
			}
			d, err := distlock.New(memory.New(), distlock.WithHandlers(hs...),
				distlock.WithSpin(100*time.Microsecond, 100*time.Microsecond))
			if err != nil {
				b.Fatal(err)
			}
			defer d.Close()
			b.SetParallelism(4)
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					lk, err := d.TryLock(b.Context(), key, 10*time.Second)
					if err != nil {
						b.Error(err)
						return
					}
					time.Sleep(50 * time.Microsecond) // the work under the lock
					lk.Unlock(b.Context())
				}
			})
			s := met.Stats()
			b.ReportMetric(float64(s.RemoteAttempts)/float64(s.Acquired), "remote/op")
		})
	}
}
