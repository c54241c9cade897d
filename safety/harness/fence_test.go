package harness

import (
	"context"
	"testing"
	"time"

	"github.com/distlock/distlock/internal/testserver"
	"github.com/distlock/distlock/safety/history"
)

// TestFenceWriter writes through each kind of Fence over its forwarding
// socket: a token below the last accepted one is refused, an equal one
// passes, the store's sequence increases with each accepted write, and
// the store's time of a write, converted to a history.Now reading, falls
// within the call (give or take a millisecond for the conversion).
func TestFenceWriter(t *testing.T) {
	for _, kind := range []string{"redis", "postgres"} {
		t.Run(kind, func(t *testing.T) {
			f := Fence{Kind: kind}
			if kind == "redis" {
				f.Addr = testserver.Redis(t).Addr
			} else {
				f.Addr = testserver.Postgres(t).DSN
			}
			ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
			defer cancel()
			if err := setUpFence(ctx, f); err != nil {
				t.Fatal(err)
			}
			fw, path, err := forward(f)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(fw.close)
			f.Socket = path
			w, err := OpenFence(ctx, f)
			if err != nil {
				t.Fatal(err)
			}
			defer w.Close()
			var lastSeq int64
			for i, s := range []struct {
				owner  string
				token  uint64
				accept bool
			}{{"a", 5, true}, {"a", 5, true}, {"b", 4, false}, {"c", 5, true}, {"d", 9, true}, {"a", 5, false}} {
				call := history.Now()
				ev, err := w.Write(ctx, "res-"+t.Name(), s.owner, s.token)
				ret := history.Now()
				if err != nil {
					t.Fatalf("write %d: %v", i, err)
				}
				if ev.Kind != history.StoreWrite || ev.Owner != s.owner || ev.Token != s.token || ev.Accepted != s.accept {
					t.Errorf("write %d (%s, %d) = %+v; want accepted %v", i, s.owner, s.token, ev, s.accept)
				}
				const slack = int64(time.Millisecond)
				if ev.At < call-slack || ev.At > ret+slack {
					t.Errorf("write %d: at %d, outside the call %d..%d", i, ev.At, call, ret)
				}
				if !s.accept {
					continue
				}
				if ev.Seq <= lastSeq {
					t.Errorf("write %d: seq %d after %d", i, ev.Seq, lastSeq)
				}
				lastSeq = ev.Seq
			}
		})
	}
}

// TestFencePausedWriter: a writer paused inside its transaction (its
// fence check made, the row locked, nothing more sent) does not keep a
// later holder's write waiting past idleTx: the server ends the paused
// transaction, the later write is accepted, and the paused writer's next
// statement fails as a transaction that wrote nothing (idleTxEnded).
func TestFencePausedWriter(t *testing.T) {
	f := Fence{Kind: "postgres", Addr: testserver.Postgres(t).DSN}
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	if err := setUpFence(ctx, f); err != nil {
		t.Fatal(err)
	}
	paused, err := OpenFence(ctx, f)
	if err != nil {
		t.Fatal(err)
	}
	defer paused.Close()
	later, err := OpenFence(ctx, f)
	if err != nil {
		t.Fatal(err)
	}
	defer later.Close()
	res := "res-" + t.Name()
	tx, err := paused.db.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback()
	if err := paused.pg.Check(ctx, tx, res, 5); err != nil {
		t.Fatal(err)
	}
	wctx, wcancel := context.WithTimeout(ctx, 15*time.Second)
	defer wcancel()
	ev, err := later.Write(wctx, res, "later", 9)
	if err != nil || !ev.Accepted {
		t.Fatalf("the later holder's write while another is paused in its transaction: %+v, %v; want accepted", ev, err)
	}
	_, err = tx.ExecContext(ctx, "SELECT 1")
	if !idleTxEnded(err) {
		t.Fatalf("the paused writer's next statement: %v; want the server's idle-transaction timeout (25P03)", err)
	}
}
