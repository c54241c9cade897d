package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strconv"
	"time"
)

// cpuTime returns the CPU time the processes pids have used so far, all
// their threads together, user and kernel: the first field of each
// thread's /proc/<pid>/task/<tid>/schedstat (nanoseconds on a CPU). It is
// exact to the nanosecond, unlike the clock ticks of /proc/<pid>/stat, so
// a slice of a second splits a cycle's cost between client and server to
// a fraction of a microsecond. A thread that exits between two readings
// takes its time with it; a process that cannot be read counts 0.
func cpuTime(pids []int) time.Duration {
	var total time.Duration
	for _, pid := range pids {
		dir := filepath.Join("/proc", strconv.Itoa(pid), "task")
		ents, err := os.ReadDir(dir)
		if err != nil {
			continue
		}
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
	}
	return total
}

// serverProcs returns the processes of a store's servers: the processes
// s started and, since each runs in a process group of its own, the
// processes they forked (PostgreSQL's backend per connection).
func serverProcs(s *servers, store string) []int {
	pids := s.pids(store)
	seen := map[int]bool{}
	var out []int
	for _, p := range append(pids, groupMembers(pids)...) {
		if p > 0 && !seen[p] {
			seen[p] = true
			out = append(out, p)
		}
	}
	return out
}
