package history

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"sync"
)

// Kind says what an [Event] records.
type Kind string

// The kinds of events.
const (
	// Acquire is one TryLock call by a worker: Call and Return around it,
	// Owner naming the acquisition, Token on success, Err otherwise.
	Acquire Kind = "acquire"
	// Release is one Unlock call: Call and Return around it, Err when it
	// failed (ErrNotHeld: the lock had been lost).
	Release Kind = "release"
	// Lost is the moment (At) the holder saw the lock's Done channel
	// closed while it had not called Unlock.
	Lost Kind = "lost"
	// Write is a write to the fenced store as the worker saw it: Call and
	// Return around the request, Token sent, Accepted the store's answer,
	// Seq the store's sequence number.
	Write Kind = "write"
	// StoreWrite is the same write as the fenced store saw it: At, Seq,
	// Owner, Token, Accepted. The store is authoritative on the order.
	StoreWrite Kind = "store-write"
	// StoreIncr is one read-modify-write of the unfenced counter as the
	// store saw its write: Read is the value the worker had read, Wrote
	// what it wrote (Read+1).
	StoreIncr Kind = "store-incr"
	// Note marks something the controller did (a fault's start or end):
	// At and Text.
	Note Kind = "note"
)

// Event is one line of a history. Times are [Now] readings.
type Event struct {
	Kind     Kind   `json:"kind"`
	Proc     string `json:"proc,omitempty"`  // the process: worker name, "store", "controller"
	Owner    string `json:"owner,omitempty"` // the acquisition: unique per TryLock
	Call     int64  `json:"call,omitempty"`
	Return   int64  `json:"return,omitempty"`
	At       int64  `json:"at,omitempty"`
	Token    uint64 `json:"token,omitempty"`
	Err      string `json:"err,omitempty"`
	Accepted bool   `json:"accepted,omitempty"`
	Seq      int64  `json:"seq,omitempty"`
	Read     int64  `json:"read,omitempty"`
	Wrote    int64  `json:"wrote,omitempty"`
	Text     string `json:"text,omitempty"`
	// Lock is the kind of lock an Acquire took: "" for a mutex,
	// "semaphore", "read" or "write".
	Lock string `json:"lock,omitempty"`
}

// Time returns the event's position in time: At, else Return, else Call.
func (e Event) Time() int64 {
	switch {
	case e.At != 0:
		return e.At
	case e.Return != 0:
		return e.Return
	}
	return e.Call
}

// Recorder appends events to one file. It is safe for concurrent use.
type Recorder struct {
	proc string
	mu   sync.Mutex
	f    *os.File
}

// Create creates (or truncates) the history file path for the process
// named proc.
func Create(path, proc string) (*Recorder, error) {
	f, err := os.OpenFile(path, os.O_CREATE|os.O_WRONLY|os.O_TRUNC|os.O_APPEND, 0o644)
	if err != nil {
		return nil, fmt.Errorf("history: %w", err)
	}
	return &Recorder{proc: proc, f: f}, nil
}

// Add appends e, setting its Proc, with one write(2) of one line, so a
// process stopped or killed at any point leaves whole lines only.
func (r *Recorder) Add(e Event) error {
	e.Proc = r.proc
	b, err := json.Marshal(e)
	if err != nil {
		return fmt.Errorf("history: %w", err)
	}
	b = append(b, '\n')
	r.mu.Lock()
	defer r.mu.Unlock()
	if _, err := r.f.Write(b); err != nil {
		return fmt.Errorf("history: %w", err)
	}
	return nil
}

// Close closes the file.
func (r *Recorder) Close() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.f.Close()
}

// ReadFiles reads and merges the history files, sorted by [Event.Time]
// (stable: events of one file keep their order on ties). A last line cut
// short (a process killed in the middle of a write) is ignored.
func ReadFiles(paths ...string) ([]Event, error) {
	var all []Event
	for _, p := range paths {
		evs, err := readFile(p)
		if err != nil {
			return nil, err
		}
		all = append(all, evs...)
	}
	sort.SliceStable(all, func(i, j int) bool { return all[i].Time() < all[j].Time() })
	return all, nil
}

// ReadDir reads every *.jsonl file in dir, as [ReadFiles].
func ReadDir(dir string) ([]Event, error) {
	paths, err := filepath.Glob(filepath.Join(dir, "*.jsonl"))
	if err != nil {
		return nil, err
	}
	return ReadFiles(paths...)
}

func readFile(path string) ([]Event, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("history: %w", err)
	}
	defer f.Close()
	var evs []Event
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	var bad error
	for sc.Scan() {
		if bad != nil { // a bad line before the last one
			return nil, bad
		}
		var e Event
		if err := json.Unmarshal(sc.Bytes(), &e); err != nil {
			bad = fmt.Errorf("history: %s: %w", path, err)
			continue
		}
		evs = append(evs, e)
	}
	if err := sc.Err(); err != nil && !errors.Is(err, os.ErrClosed) {
		return nil, fmt.Errorf("history: %s: %w", path, err)
	}
	return evs, nil
}
