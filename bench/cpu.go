package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strconv"
	"time"
)

// cpuTimes returns the CPU time each of the processes pids has used so
// far, all its threads together, user and kernel: the first field of each
// thread's /proc/<pid>/task/<tid>/schedstat (nanoseconds on a CPU). It is
// exact to the nanosecond, unlike the clock ticks of /proc/<pid>/stat, so
// a slice of a second splits a cycle's cost between client and server to
// a fraction of a microsecond. A process that cannot be read is left out.
func cpuTimes(pids []int) map[int]time.Duration {
	out := make(map[int]time.Duration, len(pids))
	for _, pid := range pids {
		dir := filepath.Join("/proc", strconv.Itoa(pid), "task")
		ents, err := os.ReadDir(dir)
		if err != nil {
			continue
		}
		var total time.Duration
		for _, e := range ents {
			b, err := os.ReadFile(filepath.Join(dir, e.Name(), "schedstat"))
			if err != nil {
				continue
			}
			if i := bytes.IndexByte(b, ' '); i > 0 {
				b = b[:i]
			}
			if ns, err := strconv.ParseInt(string(bytes.TrimSpace(b)), 10, 64); err == nil {
				total += time.Duration(ns)
			}
		}
		out[pid] = total
	}
	return out
}

// cpuSpent is the CPU time used between two readings of cpuTimes, over the
// processes in both: one that exited meanwhile takes its time with it, and
// counting it would make the sum smaller than the work done.
func cpuSpent(before, after map[int]time.Duration) time.Duration {
	var d time.Duration
	for pid, t := range after {
		if t0, ok := before[pid]; ok && t >= t0 {
			d += t - t0
		}
	}
	return d
}

// serverProcs returns the processes of a store's servers: the processes
// s started and the ones they forked (PostgreSQL's backend per
// connection); see groupMembers.
func serverProcs(s *servers, store string) []int { return groupMembers(s.pids(store)) }
