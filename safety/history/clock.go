package history

import "golang.org/x/sys/unix"

// Now returns CLOCK_MONOTONIC in nanoseconds: comparable between the
// processes of one machine, unaffected by changes to the wall clock.
func Now() int64 { return clock(unix.CLOCK_MONOTONIC) }

// FromUnix converts a wall-clock reading of this machine (nanoseconds
// since 1970: a server's clock, such as PostgreSQL's clock_timestamp() or
// Redis's TIME, read on this machine) to a [Now] reading. It reads
// CLOCK_REALTIME between two readings of CLOCK_MONOTONIC and applies the
// offset: exact to the microsecond while the wall clock is not set, and
// off by what NTP slewed it since the reading otherwise (microseconds over
// a run).
func FromUnix(ns int64) int64 {
	m1 := Now()
	wall := clock(unix.CLOCK_REALTIME)
	m2 := Now()
	return ns - wall + m1 + (m2-m1)/2
}

func clock(id int32) int64 {
	var ts unix.Timespec
	if err := unix.ClockGettime(id, &ts); err != nil {
		// clock_gettime cannot fail on Linux with a valid clock and
		// pointer.
		panic("history: clock_gettime: " + err.Error())
	}
	return ts.Nano()
}
