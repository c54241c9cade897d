// Package harness runs the fault-injection tests of package safety: worker
// processes that drive distlock against a backend, the controller that
// starts, pauses and stops them, in-process clients, network namespaces
// for partitions, and the table of results.
//
// # Workers
//
// A worker is the test binary executed again ([StartWorker], or
// [Run.Worker]) with its [Config] in an environment variable; the test
// binary's TestMain calls [MaybeRunWorker] first, which turns such a
// process into a worker. Being a process of its own, a worker can be
// frozen with SIGSTOP ([Worker.Pause]) like a process in a long GC pause,
// its lock's keep-alive goroutines included, or started in a network
// namespace ([NewNetns]) and cut off. It takes the lock again and again
// ([Config].Cycles), writes to the fenced store (the register of package
// safety/resource, or a [Fence]: a real store written through distlock's
// public helpers) and increments the unfenced counter of package
// safety/resource while it holds it, and records every step with package
// safety/history. It tells the
// controller what it does on stdout ("ready", "acquired owner token",
// "lost owner", "released owner", "exit"; see [Worker.WaitLine]) and stops
// when its stdin is closed ([Worker.Stop]).
//
// # Results
//
// [Check] runs every checker of package safety/history over a run's
// history and returns a [Result], one row of the table in
// docs/SAFETY.md; [Result.Log] logs it and [WriteReport] writes the table
// of all results to the file named by $DISTLOCK_SAFETY_REPORT.
package harness
