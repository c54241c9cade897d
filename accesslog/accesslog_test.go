package accesslog_test

import (
	"bytes"
	"encoding/json"
	"errors"
	"log/slog"
	"sync"
	"testing"

	"github.com/distlock/distlock"
	"github.com/distlock/distlock/accesslog"
	"github.com/distlock/distlock/backend"
	"github.com/distlock/distlock/backend/memory"
)

// syncBuffer is a bytes.Buffer safe for the logger's concurrent writes.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) records(t *testing.T) []map[string]any {
	t.Helper()
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []map[string]any
	dec := json.NewDecoder(&s.b)
	for dec.More() {
		var m map[string]any
		if err := dec.Decode(&m); err != nil {
			t.Fatal(err)
		}
		out = append(out, m)
	}
	return out
}

func TestAccessLog(t *testing.T) {
	var buf syncBuffer
	logger := slog.New(slog.NewJSONHandler(&buf, nil))
	store := memory.New()
	d, err := distlock.New(store, distlock.WithHandlers(accesslog.New(logger)))
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	key := t.Name()

	lk, err := d.TryLock(t.Context(), key, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := d.TryLock(t.Context(), key, 0); !errors.Is(err, distlock.ErrNotAcquired) {
		t.Fatalf("second TryLock = %v", err)
	}
	if err := lk.Unlock(t.Context()); err != nil {
		t.Fatal(err)
	}
	lk2, err := d.TryLock(t.Context(), key, 0)
	if err != nil {
		t.Fatal(err)
	}
	store.Evict(key)
	if err := lk2.Unlock(t.Context()); !errors.Is(err, distlock.ErrNotHeld) {
		t.Fatalf("Unlock after eviction = %v", err)
	}

	recs := buf.records(t)
	want := []struct{ msg, level, outcome string }{
		{"distlock acquire", "INFO", "acquired"},
		{"distlock acquire", "INFO", "not_acquired"},
		{"distlock release", "INFO", "released"},
		{"distlock acquire", "INFO", "acquired"},
		{"distlock release", "WARN", "not_held"},
	}
	if len(recs) != len(want) {
		t.Fatalf("got %d records; want %d: %v", len(recs), len(want), recs)
	}
	for i, w := range want {
		r := recs[i]
		if r["msg"] != w.msg || r["level"] != w.level || r["outcome"] != w.outcome || r["key"] != key {
			t.Errorf("record %d = %v; want msg %q level %s outcome %s key %s", i, r, w.msg, w.level, w.outcome, key)
		}
		if o, _ := r["owner"].(string); len(o) != 32 {
			t.Errorf("record %d: owner %q; want the 32-hex owner value", i, r["owner"])
		}
	}
	if recs[0]["owner"] != recs[2]["owner"] {
		t.Errorf("acquire and release of one lock carry owners %v and %v", recs[0]["owner"], recs[2]["owner"])
	}
	if _, ok := recs[0]["wait"]; !ok {
		t.Error("acquire record without wait")
	}
	if _, ok := recs[1]["error"]; !ok {
		t.Error("not_acquired record without error")
	}
	if _, ok := recs[2]["hold"]; !ok {
		t.Error("release record without hold")
	}
}

// An election's campaign and resignation are logged as any lock's, with
// kind election.
func TestAccessLogElection(t *testing.T) {
	var buf syncBuffer
	logger := slog.New(slog.NewJSONHandler(&buf, nil))
	d, err := distlock.New(memory.New(), distlock.WithHandlers(accesslog.New(logger)))
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	lead, err := d.Election("jobs").Campaign(t.Context(), "v")
	if err != nil {
		t.Fatal(err)
	}
	if err := lead.Unlock(t.Context()); err != nil {
		t.Fatal(err)
	}
	recs := buf.records(t)
	if len(recs) != 2 {
		t.Fatalf("got %d records; want 2: %v", len(recs), recs)
	}
	for i, msg := range []string{"distlock acquire", "distlock release"} {
		if r := recs[i]; r["msg"] != msg || r["kind"] != "election" || r["key"] != backend.ElectionPrefix+"jobs" {
			t.Errorf("record %d = %v; want %s of kind election, key %s", i, r, msg, backend.ElectionPrefix+"jobs")
		}
	}
}

func TestAccessLogSkipsDisabledLevels(t *testing.T) {
	var buf syncBuffer
	logger := slog.New(slog.NewJSONHandler(&buf, &slog.HandlerOptions{Level: slog.LevelWarn}))
	d, err := distlock.New(memory.New(), distlock.WithHandlers(accesslog.New(logger, accesslog.WithLevel(slog.LevelDebug))))
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	lk, err := d.TryLock(t.Context(), t.Name(), 0)
	if err != nil {
		t.Fatal(err)
	}
	if err := lk.Unlock(t.Context()); err != nil {
		t.Fatal(err)
	}
	if recs := buf.records(t); len(recs) != 0 {
		t.Errorf("got %d records below the logger's level: %v", len(recs), recs)
	}
}
