package gocron_test

import (
	"fmt"
	"slices"
	"sync"
	"time"

	gc "github.com/go-co-op/gocron/v2"

	"github.com/distlock/distlock"
	"github.com/distlock/distlock/backend/memory"
	"github.com/distlock/distlock/gocron"
)

// Two schedulers (two replicas of a service, here over the in-process
// store: any distlock store works the same) run the same job every
// 500ms. The Locker makes each tick's run happen once across both: the
// replica whose tick comes first holds the job's key, at least 300ms
// (WithMinHold), and the other, ticking a moment later, skips.
func Example_locker() {
	store := memory.New()
	const interval = 500 * time.Millisecond
	start := time.Now().Add(interval).Truncate(interval) // both tick on the same boundaries
	var (
		mu   sync.Mutex
		runs = map[int]int{} // runs per tick
		four = make(chan struct{})
	)
	job := func() {
		mu.Lock()
		defer mu.Unlock()
		tick := int(time.Since(start).Round(interval) / interval)
		if runs[tick]++; runs[tick] == 1 && len(runs) == 4 {
			close(four)
		}
	}
	var scheds []gc.Scheduler
	for range 2 {
		d, err := distlock.New(store, distlock.WithAutoRenew())
		if err != nil {
			panic(err)
		}
		defer d.Close()
		locker, err := gocron.NewLocker(d, gocron.WithMinHold(300*time.Millisecond))
		if err != nil {
			panic(err)
		}
		s, err := gc.NewScheduler(gc.WithDistributedLocker(locker))
		if err != nil {
			panic(err)
		}
		if _, err := s.NewJob(gc.DurationJob(interval), gc.NewTask(job), gc.WithName("report"),
			gc.WithStartAt(gc.WithStartDateTime(start))); err != nil {
			panic(err)
		}
		s.Start()
		scheds = append(scheds, s)
	}
	<-four
	time.Sleep(interval / 2) // a second run of the fourth tick would come by now
	for _, s := range scheds {
		_ = s.Shutdown()
	}
	mu.Lock()
	defer mu.Unlock()
	for tick := range 4 {
		fmt.Printf("tick %d: %d run(s)\n", tick, runs[tick])
	}
	// Output:
	// tick 0: 1 run(s)
	// tick 1: 1 run(s)
	// tick 2: 1 run(s)
	// tick 3: 1 run(s)
}

// Two schedulers with an Elector each: only the leader of the election
// "jobs" runs the job; the other skips every run until it is elected.
func Example_elector() {
	store := memory.New()
	var (
		mu   sync.Mutex
		runs []int // runs per scheduler
		done = make(chan struct{})
	)
	runs = make([]int, 2)
	var scheds []gc.Scheduler
	for i := range 2 {
		d, err := distlock.New(store, distlock.WithAutoRenew())
		if err != nil {
			panic(err)
		}
		defer d.Close()
		el, err := gocron.NewElector(d.Election("jobs"), fmt.Sprintf("replica-%d", i))
		if err != nil {
			panic(err)
		}
		defer el.Close()
		s, err := gc.NewScheduler(gc.WithDistributedElector(el))
		if err != nil {
			panic(err)
		}
		if _, err := s.NewJob(gc.DurationJob(100*time.Millisecond), gc.NewTask(func() {
			mu.Lock()
			defer mu.Unlock()
			if runs[i]++; runs[0]+runs[1] == 5 {
				close(done)
			}
		}), gc.WithName("report"), gc.WithLimitedRuns(5)); err != nil {
			panic(err)
		}
		s.Start()
		scheds = append(scheds, s)
	}
	<-done
	for _, s := range scheds {
		_ = s.Shutdown()
	}
	mu.Lock()
	defer mu.Unlock()
	slices.Sort(runs)
	fmt.Println("runs per scheduler:", runs)
	// Output:
	// runs per scheduler: [0 5]
}
