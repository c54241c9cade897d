package history

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/anishathalye/porcupine"
)

func acq(proc, owner string, call, ret int64, token uint64) Event {
	return Event{Kind: Acquire, Proc: proc, Owner: owner, Call: call, Return: ret, Token: token}
}

func rel(proc, owner string, call, ret int64) Event {
	return Event{Kind: Release, Proc: proc, Owner: owner, Call: call, Return: ret}
}

func lost(proc, owner string, at int64) Event {
	return Event{Kind: Lost, Proc: proc, Owner: owner, At: at}
}

func storeWrite(seq int64, owner string, token uint64, accepted bool) Event {
	return Event{Kind: StoreWrite, Proc: "store", Owner: owner, Token: token, Accepted: accepted, Seq: seq, At: 100 + seq}
}

func TestOverlaps(t *testing.T) {
	tests := []struct {
		name string
		evs  []Event
		want int
	}{
		{"one after the other", []Event{
			acq("w1", "a", 1, 2, 1), rel("w1", "a", 10, 11),
			acq("w2", "b", 3, 12, 2), rel("w2", "b", 20, 21),
		}, 0},
		{"second granted before the first unlocked", []Event{
			acq("w1", "a", 1, 2, 1), rel("w1", "a", 10, 11),
			acq("w2", "b", 3, 8, 2), rel("w2", "b", 20, 21),
		}, 1},
		{"first ended by loss before the second", []Event{
			acq("w1", "a", 1, 2, 1), lost("w1", "a", 5), rel("w1", "a", 10, 11),
			acq("w2", "b", 3, 8, 2), rel("w2", "b", 20, 21),
		}, 0},
		{"loss seen only after the second was granted (paused holder)", []Event{
			acq("w1", "a", 1, 2, 1), lost("w1", "a", 9),
			acq("w2", "b", 3, 8, 2), rel("w2", "b", 20, 21),
		}, 1},
		{"holder never let go", []Event{
			acq("w1", "a", 1, 2, 1),
			acq("w2", "b", 3, 8, 2), rel("w2", "b", 20, 21),
		}, 1},
		{"three at once", []Event{
			acq("w1", "a", 1, 2, 1), acq("w2", "b", 1, 3, 2), acq("w3", "c", 1, 4, 3),
			rel("w1", "a", 10, 11), rel("w2", "b", 10, 11), rel("w3", "c", 10, 11),
		}, 3},
		{"failed acquisitions hold nothing", []Event{
			acq("w1", "a", 1, 2, 1),
			{Kind: Acquire, Proc: "w2", Owner: "b", Call: 3, Return: 4, Err: "not acquired"},
			rel("w1", "a", 10, 11),
		}, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := Overlaps(tt.evs)
			if len(got) != tt.want {
				t.Errorf("Overlaps = %v; want %d", got, tt.want)
			}
		})
	}
}

func TestOverlapSpan(t *testing.T) {
	got := Overlaps([]Event{
		acq("w1", "a", 1, 2, 1), rel("w1", "a", 10, 11),
		acq("w2", "b", 3, 6, 2), rel("w2", "b", 20, 21),
	})
	if len(got) != 1 || got[0].Older.Owner != "a" || got[0].Newer.Owner != "b" || got[0].From != 6 || got[0].To != 10 {
		t.Fatalf("Overlaps = %+v; want a then b from 6 to 10", got)
	}
}

func TestStaleWrites(t *testing.T) {
	base := []Event{
		acq("w1", "a", 1, 2, 1), lost("w1", "a", 50),
		acq("w2", "b", 10, 12, 2), rel("w2", "b", 40, 41),
	}
	tests := []struct {
		name   string
		writes []Event
		want   int
	}{
		{"fence refuses the old holder", []Event{
			storeWrite(1, "a", 1, true), storeWrite(2, "b", 2, true), storeWrite(3, "a", 1, false),
		}, 0},
		{"old holder before the new one writes is not stale", []Event{
			storeWrite(1, "a", 1, true), storeWrite(2, "a", 1, true), storeWrite(3, "b", 2, true),
		}, 0},
		{"store accepts the old holder after the new one", []Event{
			storeWrite(1, "a", 1, true), storeWrite(2, "b", 2, true), storeWrite(3, "a", 1, true),
		}, 1},
		{"order is the store's sequence, not the list's", []Event{
			storeWrite(3, "a", 1, true), storeWrite(2, "b", 2, true),
		}, 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := StaleWrites(append(append([]Event(nil), base...), tt.writes...))
			if len(got) != tt.want {
				t.Errorf("StaleWrites = %+v; want %d", got, tt.want)
			}
			if tt.want > 0 && got[0].Newer != "b" {
				t.Errorf("StaleWrites[0].Newer = %q; want b", got[0].Newer)
			}
		})
	}
}

func TestLostIncrements(t *testing.T) {
	incr := func(seq, read int64) Event {
		return Event{Kind: StoreIncr, Seq: seq, Read: read, Wrote: read + 1, At: seq}
	}
	tests := []struct {
		name string
		evs  []Event
		want Counter
	}{
		{"serial", []Event{incr(1, 0), incr(2, 1), incr(3, 2)}, Counter{Increments: 3, Final: 3}},
		{"two read the same value", []Event{incr(1, 0), incr(2, 1), incr(3, 1)}, Counter{Increments: 3, Final: 2, Lost: 1}},
		{"a paused writer sets it back", []Event{incr(1, 0), incr(2, 1), incr(3, 2), incr(4, 0)}, Counter{Increments: 4, Final: 1, Lost: 3}},
		{"none", nil, Counter{}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := LostIncrements(tt.evs); got != tt.want {
				t.Errorf("LostIncrements = %+v; want %+v", got, tt.want)
			}
		})
	}
}

func TestTokenOrder(t *testing.T) {
	tests := []struct {
		name      string
		evs       []Event
		want      int
		duplicate bool
	}{
		{"increasing", []Event{acq("w1", "a", 1, 2, 5), acq("w2", "b", 3, 4, 6), acq("w1", "c", 5, 6, 9)}, 0, false},
		{"concurrent calls may return in any order", []Event{acq("w1", "a", 1, 4, 6), acq("w2", "b", 2, 5, 5)}, 0, false},
		{"regression after a restart", []Event{acq("w1", "a", 1, 2, 57), acq("w2", "b", 3, 4, 1)}, 1, false},
		{"duplicate after a failover", []Event{acq("w1", "a", 1, 2, 7), acq("w2", "b", 3, 4, 7)}, 1, true},
		{"no tokens (Redlock)", []Event{acq("w1", "a", 1, 2, 0), acq("w2", "b", 3, 4, 0)}, 0, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := TokenOrder(tt.evs)
			if len(got) != tt.want {
				t.Fatalf("TokenOrder = %v; want %d issues", got, tt.want)
			}
			if tt.want > 0 && got[0].Duplicate() != tt.duplicate {
				t.Errorf("Duplicate() = %v; want %v (%v)", got[0].Duplicate(), tt.duplicate, got[0])
			}
		})
	}
}

func write(proc, owner string, call, ret int64, token uint64, accepted bool) Event {
	return Event{Kind: Write, Proc: proc, Owner: owner, Call: call, Return: ret, Token: token, Accepted: accepted}
}

func TestLinearizable(t *testing.T) {
	tests := []struct {
		name string
		evs  []Event
		want porcupine.CheckResult
	}{
		{"paused holder refused by the fence", []Event{
			acq("w1", "a", 1, 2, 1), write("w1", "a", 3, 4, 1, true),
			acq("w2", "b", 10, 11, 2), write("w2", "b", 12, 13, 2, true),
			write("w1", "a", 14, 15, 1, false),
		}, porcupine.Ok},
		{"concurrent write and acquire may go either way", []Event{
			acq("w1", "a", 1, 2, 1),
			acq("w2", "b", 3, 10, 2),
			write("w1", "a", 4, 12, 1, true),
		}, porcupine.Ok},
		{"duplicate token in real time", []Event{
			acq("w1", "a", 1, 2, 7), write("w1", "a", 3, 4, 7, true),
			acq("w2", "b", 5, 6, 7), write("w2", "b", 7, 8, 7, false),
		}, porcupine.Illegal},
		{"token went backwards", []Event{
			acq("w1", "a", 1, 2, 57),
			acq("w2", "b", 5, 6, 1),
		}, porcupine.Illegal},
		{"store accepted a stale token", []Event{
			acq("w1", "a", 1, 2, 1), acq("w2", "b", 3, 4, 2),
			write("w2", "b", 5, 6, 2, true), write("w1", "a", 7, 8, 1, true),
		}, porcupine.Illegal},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dir := t.TempDir()
			got, path, err := Linearizable(tt.evs, 10*time.Second, dir)
			if err != nil {
				t.Fatal(err)
			}
			if got != tt.want {
				t.Fatalf("Linearizable = %v; want %v", got, tt.want)
			}
			if got == porcupine.Ok {
				if path != "" {
					t.Errorf("visualisation written for a linearizable history: %s", path)
				}
				return
			}
			b, err := os.ReadFile(path)
			if err != nil {
				t.Fatalf("visualisation: %v", err)
			}
			if !strings.Contains(string(b), "<html") {
				t.Errorf("%s is not HTML", path)
			}
		})
	}
}

func TestRecorderRoundTrip(t *testing.T) {
	dir := t.TempDir()
	r1, err := Create(filepath.Join(dir, "w1.jsonl"), "w1")
	if err != nil {
		t.Fatal(err)
	}
	r2, err := Create(filepath.Join(dir, "w2.jsonl"), "w2")
	if err != nil {
		t.Fatal(err)
	}
	t0 := Now()
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(r1.Add(Event{Kind: Acquire, Owner: "a", Call: t0, Return: t0 + 10, Token: 1}))
	must(r2.Add(Event{Kind: Acquire, Owner: "b", Call: t0 + 1, Return: t0 + 5, Err: "not acquired"}))
	must(r1.Add(Event{Kind: Release, Owner: "a", Call: t0 + 20, Return: t0 + 21}))
	must(r1.Close())
	must(r2.Close())
	// A process killed in the middle of a line leaves a partial last line.
	f, err := os.OpenFile(filepath.Join(dir, "w2.jsonl"), os.O_APPEND|os.O_WRONLY, 0)
	must(err)
	_, err = f.WriteString(`{"kind":"acq`)
	must(err)
	must(f.Close())

	evs, err := ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, e := range evs {
		got = append(got, e.Proc+":"+e.Owner+":"+string(e.Kind))
	}
	want := "w2:b:acquire w1:a:acquire w1:a:release"
	if strings.Join(got, " ") != want {
		t.Errorf("ReadDir = %v; want %s", got, want)
	}
}

// TestNowAcrossProcesses runs this test binary again and checks that the
// child's reading of Now falls between two readings of the parent's: the
// clock is one clock for every process, which time.Now's monotonic
// reading is not.
func TestNowAcrossProcesses(t *testing.T) {
	if os.Getenv("HISTORY_PRINT_NOW") != "" {
		fmt.Println("now", Now())
		return
	}
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(exe, "-test.run=^TestNowAcrossProcesses$", "-test.count=1")
	cmd.Env = append(os.Environ(), "HISTORY_PRINT_NOW=1")
	before := Now()
	out, err := cmd.Output()
	after := Now()
	if err != nil {
		t.Fatalf("child: %v\n%s", err, out)
	}
	var child int64
	for _, line := range strings.Split(string(out), "\n") {
		if v, ok := strings.CutPrefix(line, "now "); ok {
			child, err = strconv.ParseInt(v, 10, 64)
			if err != nil {
				t.Fatal(err)
			}
		}
	}
	if child < before || child > after {
		t.Errorf("child read %d, outside the parent's %d..%d", child, before, after)
	}
}

func TestMostHoldersAndExclusive(t *testing.T) {
	kind := func(e Event, lock string) Event { e.Lock = lock; return e }
	evs := []Event{
		kind(acq("w1", "a", 1, 2, 1), "semaphore"), rel("w1", "a", 10, 11),
		kind(acq("w2", "b", 1, 3, 2), "semaphore"), rel("w2", "b", 16, 17),
		kind(acq("w3", "c", 1, 10, 3), "semaphore"), lost("w3", "c", 15), // touches a's end: not at once
		kind(acq("w4", "d", 11, 14, 4), "semaphore"), rel("w4", "d", 20, 21),
	}
	if n, at := MostHolders(evs); n != 3 || at != 14 {
		t.Errorf("MostHolders = %d at %d; want 3 at 14 (b, c, d)", n, at)
	}
	for _, o := range Overlaps(evs) {
		if o.Exclusive() {
			t.Errorf("%v: two permits of a semaphore counted as exclusive", o)
		}
	}
	rw := []Event{
		kind(acq("w1", "a", 1, 2, 1), "read"), rel("w1", "a", 10, 11),
		kind(acq("w2", "b", 1, 3, 2), "read"), rel("w2", "b", 10, 11),
		kind(acq("w3", "c", 4, 5, 3), "write"), rel("w3", "c", 12, 13),
	}
	var exclusive int
	for _, o := range Overlaps(rw) {
		if o.Exclusive() {
			exclusive++
		}
	}
	if exclusive != 2 {
		t.Errorf("%d exclusive overlaps in %v; want 2 (the writer with each reader)", exclusive, Overlaps(rw))
	}
}
