// Package history records what the processes of a fault-injection test did
// to a lock and checks the record, the way Jepsen checks its histories.
//
// # Recording
//
// Each worker process appends [Event]s, one JSON object per line, to a file
// of its own through a [Recorder]; the protected resource (see package
// safety/resource) appends the writes it accepted or refused. Every write
// to the file is one write(2) of one whole line, so a worker that is
// SIGSTOPped or SIGKILLed leaves a history that ends at its last complete
// event. [ReadFiles] merges the files.
//
// # Clock
//
// Timestamps are [Now]: CLOCK_MONOTONIC in nanoseconds, read with
// clock_gettime(2). On one machine that clock is shared by every process,
// so the readings of different processes compare; it does not jump when
// the wall clock is set. (Go's time.Now carries a monotonic reading too,
// but only as an offset from the process's own start: it cannot be
// compared across processes.) Timestamps of different machines do not
// compare, and this package does not try.
//
// # Checkers
//
//   - [Overlaps]: pairs of acquisitions by different owners whose holding
//     intervals intersect. An interval runs from the return of the acquire
//     to the first of: the call of Unlock, the moment the holder saw the
//     lock's Done channel closed (the library itself ended the interval),
//     the end of the history.
//   - [StaleWrites]: writes the fenced store accepted from an owner after it
//     had accepted a write from an owner that acquired later in real time.
//   - [LostIncrements]: increments of the unfenced guarded counter that a
//     concurrent read-modify-write overwrote.
//   - [TokenOrder]: acquisitions that got a token no larger than one
//     handed out to an acquisition that had returned before they began
//     (duplicates and regressions).
//   - [Linearizable]: the history of acquisitions and fenced writes checked
//     with porcupine against [FencedMutexModel], with an HTML visualisation
//     of a failure.
package history
