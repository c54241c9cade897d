package fence_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/distlock/distlock"
	"github.com/distlock/distlock/backend/memory"
	"github.com/distlock/distlock/fence"
)

// The README's example: a holder paused past its TTL has its write
// refused. The resource is a service that keeps one document per path and
// checks the writer's token with fence.Middleware.
func Example() {
	ctx := context.Background()

	// The resource.
	var mu sync.Mutex
	docs := map[string]string{}
	save := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		mu.Lock()
		docs[r.URL.Path] = string(b)
		mu.Unlock()
	})
	srv := httptest.NewServer(fence.Middleware(new(fence.Local), nil)(save))
	defer srv.Close()

	// A writer sends its token with every write.
	put := func(token uint64, text string) error {
		req, err := http.NewRequestWithContext(ctx, http.MethodPut, srv.URL+"/invoice/42", strings.NewReader(text))
		if err != nil {
			return err
		}
		req.Header.Set(fence.Header, strconv.FormatUint(token, 10))
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			return err
		}
		defer resp.Body.Close()
		return fence.CheckResponse(resp) // a *fence.StaleError on 409
	}

	d, err := distlock.New(memory.New(), distlock.WithDefaultTTL(100*time.Millisecond))
	if err != nil {
		panic(err)
	}
	defer d.Close()

	a, err := d.TryLock(ctx, "invoice:42", 0)
	if err != nil {
		panic(err)
	}
	fmt.Println("A writes:", put(a.Token(), "draft by A"))

	// A stops (a GC pause, a swapped-out page) past its TTL: the lock
	// expires, and B takes it.
	<-a.Done()
	b, err := d.TryLock(ctx, "invoice:42", time.Second)
	if err != nil {
		panic(err)
	}
	fmt.Println("B writes:", put(b.Token(), "total by B"))

	// A wakes up and, not looking at Done, writes with its old token.
	err = put(a.Token(), "total by A")
	fmt.Println("A writes again:", err)
	fmt.Println("refused as stale:", errors.Is(err, fence.ErrStale))
	fmt.Println("the document:", docs["/invoice/42"])
	// Output:
	// A writes: <nil>
	// B writes: <nil>
	// A writes again: fence: token 1 is below 2, the highest accepted
	// refused as stale: true
	// the document: total by B
}

// A write to PostgreSQL fenced inside its transaction: the UPDATE commits
// only if the token is not below one the invoice has seen.
func ExampleSQL_Check() {
	var (
		ctx   context.Context
		db    *sql.DB // opened with a PostgreSQL driver
		lk    *distlock.Lock
		total int
	)
	invoices, err := fence.Postgres(fence.DefaultTable)
	if err != nil {
		panic(err)
	}
	// Once, at start-up (or run the statement in SQL's documentation).
	if err := invoices.CreateTable(ctx, db); err != nil {
		panic(err)
	}

	write := func() error {
		tx, err := db.BeginTx(ctx, nil)
		if err != nil {
			return err
		}
		defer tx.Rollback() // after Commit: a no-op
		if err := invoices.Check(ctx, tx, "invoice:42", lk.Token()); err != nil {
			return err // errors.Is(err, fence.ErrStale): a newer holder has written
		}
		if _, err := tx.ExecContext(ctx, "UPDATE invoices SET total = $1 WHERE id = 42", total); err != nil {
			return err
		}
		return tx.Commit()
	}
	_ = write
}
