package resource

import (
	"path/filepath"
	"testing"

	"github.com/distlock/distlock/safety/history"
)

func TestFenceAndCounter(t *testing.T) {
	dir := t.TempDir()
	rec, err := history.Create(filepath.Join(dir, "store.jsonl"), "store")
	if err != nil {
		t.Fatal(err)
	}
	s, err := Listen(filepath.Join(dir, "sock"), rec)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	c, err := Dial(filepath.Join(dir, "sock"))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ctx := t.Context()

	writes := []struct {
		owner string
		token uint64
		want  bool
	}{
		{"a", 5, true},
		{"a", 5, true},  // the same holder again
		{"b", 5, false}, // the same token from another owner
		{"c", 4, false}, // an older token
		{"d", 6, true},
		{"a", 5, false}, // the old holder after a newer one
	}
	for i, w := range writes {
		got, seq, err := c.Write(ctx, w.owner, w.token)
		if err != nil {
			t.Fatal(err)
		}
		if got != w.want || seq != int64(i+1) {
			t.Errorf("write %d (%s, %d) = %v, seq %d; want %v, seq %d", i, w.owner, w.token, got, seq, w.want, i+1)
		}
	}
	for range 3 {
		v, err := c.Get(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if err := c.Set(ctx, "a", v, v+1); err != nil {
			t.Fatal(err)
		}
	}
	if err := c.Set(ctx, "z", 1, 2); err != nil { // a stale read-modify-write
		t.Fatal(err)
	}
	acc, ref, counter := s.Stats()
	if acc != 3 || ref != 3 || counter != 2 {
		t.Errorf("Stats = %d, %d, %d; want 3, 3, 2", acc, ref, counter)
	}
	rec.Close()
	evs, err := history.ReadFiles(filepath.Join(dir, "store.jsonl"))
	if err != nil {
		t.Fatal(err)
	}
	if got := history.Rejected(evs); got != 3 {
		t.Errorf("Rejected = %d; want 3", got)
	}
	if got := history.LostIncrements(evs); got != (history.Counter{Increments: 4, Final: 2, Lost: 2}) {
		t.Errorf("LostIncrements = %+v; want 4, 2, 2", got)
	}
}
