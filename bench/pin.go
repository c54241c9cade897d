package main

import (
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// pinning holds the CPU masks that pin replaced, so unpin can put them
// back.
type pinning struct {
	saved  map[int]unix.CPUSet // task id -> its mask before pinning
	groups map[int]unix.CPUSet // server process group -> its leader's mask
	cpu    int
}

// pin moves every thread of this process and of the process groups of
// pids (the servers: each runs in a group of its own) onto one CPU, so
// that client and server share it. On these small machines a loopback
// round trip costs about 13us when client and server share a CPU and
// about 65us when they do not, and the kernel moves them at random: an
// unpinned run compares placements, not code.
func pin(pids []int, cpu int) (*pinning, error) {
	p := &pinning{saved: map[int]unix.CPUSet{}, groups: map[int]unix.CPUSet{}, cpu: cpu}
	var set unix.CPUSet
	set.Set(cpu)
	for _, g := range pids {
		var old unix.CPUSet
		if g > 0 && unix.SchedGetaffinity(g, &old) == nil {
			p.groups[g] = old
		}
	}
	tasks := threadsOf(os.Getpid())
	for _, pid := range groupMembers(pids) {
		tasks = append(tasks, threadsOf(pid)...)
	}
	// One CPU, one P: as under taskset, where the runtime sizes GOMAXPROCS
	// to the CPUs it may use. A second P would only spin against the server.
	runtime.GOMAXPROCS(1)
	for _, tid := range tasks {
		var old unix.CPUSet
		if err := unix.SchedGetaffinity(tid, &old); err != nil {
			continue // the thread exited
		}
		if err := unix.SchedSetaffinity(tid, &set); err != nil {
			p.unpin()
			return nil, fmt.Errorf("pin thread %d to CPU %d: %w", tid, cpu, err)
		}
		p.saved[tid] = old
	}
	return p, nil
}

// unpin restores the masks; threads and processes started while pinned
// (PostgreSQL forks a backend per connection) get their group's original
// mask.
func (p *pinning) unpin() {
	if p == nil {
		return
	}
	defer runtime.SetDefaultGOMAXPROCS()
	for g, set := range p.groups {
		for _, pid := range groupMembers([]int{g}) {
			for _, tid := range threadsOf(pid) {
				if _, done := p.saved[tid]; !done {
					_ = unix.SchedSetaffinity(tid, &set)
				}
			}
		}
	}
	self := os.Getpid()
	orig, ok := p.saved[self]
	for tid, set := range p.saved {
		_ = unix.SchedSetaffinity(tid, &set)
	}
	if ok {
		for _, tid := range threadsOf(self) {
			if _, done := p.saved[tid]; !done {
				_ = unix.SchedSetaffinity(tid, &orig)
			}
		}
	}
}

func threadsOf(pid int) []int {
	ents, err := os.ReadDir(filepath.Join("/proc", strconv.Itoa(pid), "task"))
	if err != nil {
		return nil
	}
	var tids []int
	for _, e := range ents {
		if tid, err := strconv.Atoi(e.Name()); err == nil {
			tids = append(tids, tid)
		}
	}
	return tids
}

// groupMembers returns the processes of pgids, those whose process group
// is one of pgids (each server runs in a group of its own, led by the
// process we started), and their descendants: PostgreSQL's backends call setsid and so leave
// their postmaster's group.
func groupMembers(pgids []int) []int {
	want := map[int]bool{}
	for _, g := range pgids {
		if g > 0 {
			want[g] = true
		}
	}
	if len(want) == 0 {
		return nil
	}
	ents, _ := os.ReadDir("/proc")
	children := map[int][]int{}
	in := map[int]bool{}
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile(filepath.Join("/proc", e.Name(), "stat"))
		if err != nil {
			continue
		}
		// pid (comm) state ppid pgrp ...: comm may hold spaces and ')'.
		s := string(b)
		i := strings.LastIndexByte(s, ')')
		if i < 0 {
			continue
		}
		f := strings.Fields(s[i+1:])
		if len(f) < 3 {
			continue
		}
		if ppid, err := strconv.Atoi(f[1]); err == nil {
			children[ppid] = append(children[ppid], pid)
		}
		if g, err := strconv.Atoi(f[2]); err == nil && want[g] || want[pid] {
			in[pid] = true // a member, or one of pgids that leads no group
		}
	}
	var out []int
	queue := slices.Collect(maps.Keys(in))
	for len(queue) > 0 {
		pid := queue[0]
		queue = queue[1:]
		out = append(out, pid)
		for _, c := range children[pid] {
			if !in[c] {
				in[c] = true
				queue = append(queue, c)
			}
		}
	}
	return out
}
