package history

import "golang.org/x/sys/unix"

// Now returns CLOCK_MONOTONIC in nanoseconds: comparable between the
// processes of one machine, unaffected by changes to the wall clock.
func Now() int64 {
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts); err != nil {
		// clock_gettime(CLOCK_MONOTONIC) cannot fail on Linux with a
		// valid pointer.
		panic("history: clock_gettime(CLOCK_MONOTONIC): " + err.Error())
	}
	return ts.Nano()
}
