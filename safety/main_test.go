package safety

import (
	"fmt"
	"os"
	"strconv"
	"testing"
	"time"

	"github.com/distlock/distlock/safety/harness"
)

func TestMain(m *testing.M) {
	harness.MaybeRunWorker()
	if soak > 1 {
		fmt.Fprintf(os.Stderr, "safety: soak x%d, seed %d (DISTLOCK_SAFETY_SEED=%d reruns it)\n", soak, seed, seed)
	}
	code := m.Run()
	if err := harness.WriteReport(); err != nil {
		fmt.Fprintln(os.Stderr, "safety: report:", err)
		code = 1
	}
	os.Exit(code)
}

// soak is how much longer the runs are under `make soak`
// (DISTLOCK_SAFETY_SOAK=n: n times; 1 for the short runs of make test).
var soak = func() int {
	n, err := strconv.Atoi(os.Getenv("DISTLOCK_SAFETY_SOAK"))
	if err != nil || n < 1 {
		return 1
	}
	return n
}()

// seed is the fixed seed of the tests' random choices; DISTLOCK_SAFETY_SEED
// overrides it.
var seed = func() uint64 {
	n, err := strconv.ParseUint(os.Getenv("DISTLOCK_SAFETY_SEED"), 10, 64)
	if err != nil {
		return 20261122
	}
	return n
}()

// waitUntil polls cond every few milliseconds until it holds or fails the
// test after d.
func waitUntil(t testing.TB, d time.Duration, what string, cond func() bool) {
	t.Helper()
	end := time.Now().Add(d)
	for !cond() {
		if time.Now().After(end) {
			t.Fatalf("timed out after %v waiting for %s", d, what)
		}
		time.Sleep(2 * time.Millisecond) // polling with a deadline
	}
}
