package fence_test

import (
	"context"
	"errors"
	"math"
	"math/rand/v2"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/distlock/distlock"
	"github.com/distlock/distlock/fence"
)

func TestStaleError(t *testing.T) {
	var err error = &fence.StaleError{Resource: "invoice:42", Token: 5, Highest: 7}
	if !errors.Is(err, fence.ErrStale) {
		t.Errorf("errors.Is(%v, ErrStale) = false", err)
	}
	var se *fence.StaleError
	if !errors.As(err, &se) || se.Token != 5 || se.Highest != 7 {
		t.Errorf("errors.As = %+v; want tokens 5 and 7", se)
	}
	if got, want := err.Error(), `fence: "invoice:42": token 5 is below 7, the highest accepted`; got != want {
		t.Errorf("Error() = %q; want %q", got, want)
	}
	if got, want := (&fence.StaleError{Token: 1, Highest: 2}).Error(), "fence: token 1 is below 2, the highest accepted"; got != want {
		t.Errorf("Error() = %q; want %q", got, want)
	}
}

func TestLocalBadInput(t *testing.T) {
	var l fence.Local
	for _, c := range []struct {
		resource string
		token    uint64
	}{{"", 1}, {"r", 0}, {"", 0}} {
		if err := l.Check(context.Background(), c.resource, c.token); !errors.Is(err, distlock.ErrInvalid) {
			t.Errorf("Check(%q, %d) = %v; want ErrInvalid", c.resource, c.token, err)
		}
	}
	// Nothing was recorded: token 1 still passes.
	if err := l.Check(context.Background(), "r", 1); err != nil {
		t.Errorf("Check(r, 1) after bad input = %v; want nil", err)
	}
}

func TestLocalRules(t *testing.T) {
	var l fence.Local
	ctx := context.Background()
	steps := []struct {
		resource string
		token    uint64
		highest  uint64 // 0: accepted
	}{
		{"a", 5, 0},
		{"a", 5, 0}, // the same holder again
		{"a", 4, 5},
		{"b", 1, 0}, // another resource: its own tokens
		{"a", 6, 0},
		{"a", 5, 6},
		{"b", 1, 0},
	}
	for i, s := range steps {
		err := l.Check(ctx, s.resource, s.token)
		var se *fence.StaleError
		switch {
		case s.highest == 0 && err != nil:
			t.Errorf("step %d: Check(%s, %d) = %v; want nil", i, s.resource, s.token, err)
		case s.highest != 0 && (!errors.As(err, &se) || *se != fence.StaleError{Resource: s.resource, Token: s.token, Highest: s.highest}):
			t.Errorf("step %d: Check(%s, %d) = %v; want stale, highest %d", i, s.resource, s.token, err, s.highest)
		}
	}
}

// TestLocalConcurrent: goroutines check interleaved tokens of a few
// resources. A check must refuse a token below one whose acceptance had
// returned before it began, refuse only with a higher token, and the
// highest accepted token of each resource must be what the guard keeps.
func TestLocalConcurrent(t *testing.T) {
	const workers, rounds, resources = 8, 2000, 3
	var l fence.Local
	var next atomic.Uint64
	var returned [resources]atomic.Uint64 // highest acceptance that returned
	var wg sync.WaitGroup
	for w := range workers {
		wg.Go(func() {
			rnd := rand.New(rand.NewPCG(7, uint64(w)))
			for range rounds {
				r := rnd.IntN(resources)
				tok := max(next.Add(1), 4) - uint64(rnd.IntN(4)) // some late, some duplicates
				floor := returned[r].Load()
				err := l.Check(context.Background(), string(rune('a'+r)), tok)
				var se *fence.StaleError
				switch {
				case err == nil:
					if tok < floor {
						t.Errorf("token %d accepted after %d had been", tok, floor)
					}
					raise(&returned[r], tok)
				case errors.As(err, &se):
					if se.Highest <= tok {
						t.Errorf("token %d refused with highest %d", tok, se.Highest)
					}
				default:
					t.Errorf("Check = %v", err)
				}
			}
		})
	}
	wg.Wait()
	for r := range resources {
		h := returned[r].Load()
		if err := l.Check(context.Background(), string(rune('a'+r)), h); err != nil {
			t.Errorf("resource %d: the highest accepted token %d is refused: %v", r, h, err)
		}
		if err := l.Check(context.Background(), string(rune('a'+r)), h-1); !errors.Is(err, fence.ErrStale) {
			t.Errorf("resource %d: token %d below the highest accepted = %v; want ErrStale", r, h-1, err)
		}
	}
}

func TestSQLBadInput(t *testing.T) {
	for _, name := range []string{"", "a.b.c", "1t", "t-1", `t"`, "t;drop", strings.Repeat("t", 64), "s."} {
		for _, ctor := range []func(string) (*fence.SQL, error){fence.Postgres, fence.MySQL} {
			if s, err := ctor(name); !errors.Is(err, distlock.ErrInvalid) || s != nil {
				t.Errorf("table %q: %v, %v; want nil, ErrInvalid", name, s, err)
			}
		}
	}
	pg, err := fence.Postgres("public." + fence.DefaultTable)
	if err != nil {
		t.Fatal(err)
	}
	my, err := fence.MySQL(fence.DefaultTable)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	long := strings.Repeat("r", fence.MaxResourceLen+1)
	for _, c := range []struct {
		s        *fence.SQL
		resource string
		token    uint64
	}{
		{pg, "", 1}, {my, "", 1}, {pg, "r", 0}, {my, "r", 0},
		{pg, long, 1}, {my, long, 1},
		{pg, "r\x00", 1}, {pg, "\xff", 1}, {pg, "r", math.MaxInt64 + 1},
		{pg, "r", 1}, {my, "r", 1}, // a nil transaction
	} {
		if err := c.s.Check(ctx, nil, c.resource, c.token); !errors.Is(err, distlock.ErrInvalid) {
			t.Errorf("Check(%.10q, %d) = %v; want ErrInvalid", c.resource, c.token, err)
		}
	}
	if err := pg.CreateTable(ctx, nil); !errors.Is(err, distlock.ErrInvalid) {
		t.Errorf("CreateTable(nil) = %v; want ErrInvalid", err)
	}
}

// raise makes a hold v if v is larger than what it holds.
func raise(a *atomic.Uint64, v uint64) {
	for h := a.Load(); v > h && !a.CompareAndSwap(h, v); h = a.Load() {
	}
}
