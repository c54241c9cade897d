package harness

import (
	"context"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/anishathalye/porcupine"

	"github.com/distlock/distlock/safety/history"
	"github.com/distlock/distlock/safety/resource"
)

// Run is one fault-injection run: a directory of history files, the
// protected resource, and the workers.
type Run struct {
	Dir   string
	Store *resource.Server

	t      testing.TB
	sock   string
	ctrl   *history.Recorder
	n      int
	fences map[string]string // a Fence's Addr -> the socket forwarding to it
}

// NewRun starts the protected resource for t in a fresh directory.
func NewRun(t testing.TB) *Run {
	t.Helper()
	dir := t.TempDir()
	storeRec, err := history.Create(filepath.Join(dir, "store.jsonl"), "store")
	if err != nil {
		t.Fatal(err)
	}
	ctrl, err := history.Create(filepath.Join(dir, "controller.jsonl"), "controller")
	if err != nil {
		t.Fatal(err)
	}
	// Unix socket paths are short (108 bytes): not under t.TempDir's long name.
	sockDir, err := os.MkdirTemp("", "dlsafety")
	if err != nil {
		t.Fatal(err)
	}
	sock := filepath.Join(sockDir, "s")
	s, err := resource.Listen(sock, storeRec)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = s.Close()
		_ = storeRec.Close()
		_ = ctrl.Close()
		_ = os.RemoveAll(sockDir)
	})
	return &Run{Dir: dir, Store: s, t: t, sock: sock, ctrl: ctrl}
}

// Worker starts a worker with cfg, filling in its name (w1, w2, ... unless
// set), history file and resource socket.
func (r *Run) Worker(cfg Config) *Worker {
	r.t.Helper()
	r.n++
	if cfg.Name == "" {
		cfg.Name = fmt.Sprintf("w%d", r.n)
	}
	cfg.History = filepath.Join(r.Dir, cfg.Name+".jsonl")
	cfg.Resource = r.sock
	if cfg.Fence.Kind != "" {
		cfg.Fence.Socket = r.fenceSocket(cfg.Fence)
	}
	return StartWorker(r.t, cfg)
}

// fenceSocket returns the socket that forwards to f's store, starting it
// (and setting the store up) the first time.
func (r *Run) fenceSocket(f Fence) string {
	r.t.Helper()
	if path, ok := r.fences[f.Addr]; ok {
		return path
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := setUpFence(ctx, f); err != nil {
		r.t.Fatalf("harness: fence: %v", err)
	}
	fw, path, err := forward(f)
	if err != nil {
		r.t.Fatalf("harness: fence: %v", err)
	}
	r.t.Cleanup(fw.close)
	if r.fences == nil {
		r.fences = map[string]string{}
	}
	r.fences[f.Addr] = path
	return path
}

// Note records what the controller did and returns when.
func (r *Run) Note(text string) int64 {
	at := history.Now()
	if err := r.ctrl.Add(history.Event{Kind: history.Note, At: at, Text: text}); err != nil {
		r.t.Fatal(err)
	}
	return at
}

// History reads the run's merged history.
func (r *Run) History() []history.Event {
	r.t.Helper()
	evs, err := history.ReadDir(r.Dir)
	if err != nil {
		r.t.Fatal(err)
	}
	return evs
}

// Result is what the checkers found in one run: one row of the table in
// docs/SAFETY.md.
type Result struct {
	Backend, Fault string
	Acquisitions   int
	Overlaps       []history.Overlap
	// Uncaught are the overlaps during which the fenced store accepted
	// writes from both holders: the token did not keep them apart.
	Uncaught      []history.Overlap
	Stale         []history.StaleWrite
	Counter       history.Counter
	TokenIssues   []history.TokenIssue
	Rejected      int
	Linearizable  porcupine.CheckResult
	Visualization string // porcupine's HTML when not linearizable
	// Measured by the test where it applies; < 0: not measured.
	LossLatency time.Duration // from the loss (or wake-up) to Done closing
	Recovery    time.Duration // from the fault's end to the next acquisition
	Orphans     int
	Notes       string
	// MostHolders is the largest number of holdings that intersected at
	// one moment: for a semaphore, what must not exceed its limit.
	MostHolders int
}

// Check runs every checker over evs. A porcupine failure's visualisation
// goes to the test's artifact directory (go test -artifacts), else to a
// directory under os.TempDir that is kept, and is logged.
func Check(t *testing.T, backendName, fault string, evs []history.Event) *Result {
	t.Helper()
	res := &Result{
		Backend: backendName, Fault: fault,
		Acquisitions: history.Acquisitions(evs),
		Overlaps:     history.Overlaps(evs),
		Stale:        history.StaleWrites(evs),
		Counter:      history.LostIncrements(evs),
		TokenIssues:  history.TokenOrder(evs),
		Rejected:     history.Rejected(evs),
		LossLatency:  -1, Recovery: -1, Orphans: -1,
	}
	res.MostHolders, _ = history.MostHolders(evs)
	if kinds := lockKinds(evs); kinds {
		// A semaphore's permits and a read/write lock's readers hold
		// together: only the overlaps their rules forbid count, and the
		// fenced-mutex model of porcupine does not apply.
		res.Overlaps = slices.DeleteFunc(res.Overlaps, func(o history.Overlap) bool { return !o.Exclusive() })
		res.Uncaught = uncaught(res.Overlaps, evs)
		return res
	}
	res.Uncaught = uncaught(res.Overlaps, evs)
	var err error
	res.Linearizable, res.Visualization, err = history.Linearizable(evs, 60*time.Second, artifactDir(t))
	if err != nil {
		t.Errorf("porcupine visualisation: %v", err)
	}
	if res.Visualization != "" {
		t.Logf("porcupine: %s; visualisation: %s", res.Linearizable, res.Visualization)
	}
	return res
}

// lockKinds reports whether evs holds acquisitions of other kinds of lock
// than the mutex (an election's leadership is one).
func lockKinds(evs []history.Event) bool {
	for _, e := range evs {
		if e.Kind == history.Acquire && e.Lock != "" && e.Lock != "election" {
			return true
		}
	}
	return false
}

// artifactDir is the test's artifact directory under go test -artifacts;
// otherwise a directory under os.TempDir that is removed when the test
// passes and kept (and named in the log) when it fails.
func artifactDir(t *testing.T) string {
	if f := flag.Lookup("test.artifacts"); f != nil && f.Value.String() == "true" {
		return t.ArtifactDir()
	}
	name := strings.NewReplacer("/", "_", " ", "_").Replace(t.Name())
	dir := filepath.Join(os.TempDir(), "distlock-safety", fmt.Sprintf("%s-%d", name, time.Now().UnixNano()))
	t.Cleanup(func() {
		if t.Failed() {
			if _, err := os.Stat(dir); err == nil {
				t.Logf("kept %s", dir)
			}
			return
		}
		_ = os.RemoveAll(dir)
	})
	return dir
}

// uncaught returns the overlaps during which the fenced store accepted
// writes from both holders.
func uncaught(overlaps []history.Overlap, evs []history.Event) []history.Overlap {
	var out []history.Overlap
	for _, o := range overlaps {
		var older, newer bool
		for _, e := range evs {
			if e.Kind != history.StoreWrite || !e.Accepted || e.At < o.From || e.At > o.To {
				continue
			}
			older = older || e.Owner == o.Older.Owner
			newer = newer || e.Owner == o.Newer.Owner
		}
		if older && newer {
			out = append(out, o)
		}
	}
	return out
}

// Log writes the result to the test log.
func (res *Result) Log(t testing.TB) {
	t.Helper()
	t.Logf("%s / %s: %s", res.Backend, res.Fault, res.Summary())
	for i, o := range res.Overlaps {
		if i == 5 {
			t.Logf("  ... %d more overlaps", len(res.Overlaps)-5)
			break
		}
		t.Logf("  overlap: %v", o)
	}
	for i, s := range res.Stale {
		if i == 5 {
			break
		}
		t.Logf("  stale write accepted: %+v after %s", s.Write, s.Newer)
	}
	for i, ti := range res.TokenIssues {
		if i == 5 {
			t.Logf("  ... %d more token issues", len(res.TokenIssues)-5)
			break
		}
		t.Logf("  %v", ti)
	}
	record(res)
}

// Summary is the result on one line.
func (res *Result) Summary() string {
	return fmt.Sprintf("acquisitions=%d overlaps=%d (uncaught %d) stale-accepted=%d refused=%d lost-increments=%d token-issues=%d porcupine=%s loss-latency=%s recovery=%s orphans=%s %s",
		res.Acquisitions, len(res.Overlaps), len(res.Uncaught), len(res.Stale), res.Rejected, res.Counter.Lost, len(res.TokenIssues),
		verdict(res.Linearizable), dur(res.LossLatency), dur(res.Recovery), num(res.Orphans), res.Notes)
}

func verdict(c porcupine.CheckResult) string {
	if c == "" {
		return "-"
	}
	return string(c)
}

func dur(d time.Duration) string {
	if d < 0 {
		return "-"
	}
	return d.Round(100 * time.Microsecond).String()
}

func num(n int) string {
	if n < 0 {
		return "-"
	}
	return fmt.Sprint(n)
}

var (
	reportMu sync.Mutex
	report   []*Result
)

func record(res *Result) {
	reportMu.Lock()
	defer reportMu.Unlock()
	report = append(report, res)
}

// ReportEnv names a file WriteReport writes the results' table to.
const ReportEnv = "DISTLOCK_SAFETY_REPORT"

// WriteReport writes the table of every logged result, as markdown, to
// the file named by $DISTLOCK_SAFETY_REPORT, if set. Call it at the end of
// TestMain.
func WriteReport() error {
	path := os.Getenv(ReportEnv)
	if path == "" {
		return nil
	}
	reportMu.Lock()
	defer reportMu.Unlock()
	rows := append([]*Result(nil), report...)
	sort.SliceStable(rows, func(i, j int) bool {
		if rows[i].Backend != rows[j].Backend {
			return rows[i].Backend < rows[j].Backend
		}
		return rows[i].Fault < rows[j].Fault
	})
	var b strings.Builder
	b.WriteString("| backend | fault | acquisitions | overlaps (uncaught by token) | stale writes accepted | writes refused | lost increments | token issues | porcupine | loss-signal latency | recovery | orphans | notes |\n")
	b.WriteString("|---|---|---:|---:|---:|---:|---:|---:|---|---:|---:|---:|---|\n")
	for _, r := range rows {
		fmt.Fprintf(&b, "| %s | %s | %d | %d (%d) | %d | %d | %d | %d | %s | %s | %s | %s | %s |\n",
			r.Backend, r.Fault, r.Acquisitions, len(r.Overlaps), len(r.Uncaught), len(r.Stale), r.Rejected, r.Counter.Lost,
			len(r.TokenIssues), verdict(r.Linearizable), dur(r.LossLatency), dur(r.Recovery), num(r.Orphans), r.Notes)
	}
	return os.WriteFile(path, []byte(b.String()), 0o644)
}
