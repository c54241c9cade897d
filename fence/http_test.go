package fence_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/distlock/distlock/fence"
)

// failing is a Guard whose store is down.
type failing struct{}

func (failing) Check(context.Context, string, uint64) error { return errors.New("connection refused") }

func TestMiddlewareAnswers(t *testing.T) {
	var served atomic.Int64
	ok := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { served.Add(1) })
	local := new(fence.Local)
	if err := local.Check(context.Background(), "/r", 7); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name   string
		guard  fence.Guard
		res    func(*http.Request) string
		header string // "-": none
		status int
		served bool
	}{
		{"no header", local, nil, "-", http.StatusPreconditionRequired, false},
		{"empty header", local, nil, "", http.StatusPreconditionRequired, false},
		{"not a number", local, nil, "x7", http.StatusBadRequest, false},
		{"negative", local, nil, "-7", http.StatusBadRequest, false},
		{"token 0", local, nil, "0", http.StatusBadRequest, false},
		{"empty resource", local, func(*http.Request) string { return "" }, "8", http.StatusBadRequest, false},
		{"stale", local, nil, "6", http.StatusConflict, false},
		{"equal", local, nil, "7", http.StatusOK, true},
		{"newer", local, nil, "8", http.StatusOK, true},
		{"stale after newer", local, nil, "7", http.StatusConflict, false},
		{"another resource", local, func(*http.Request) string { return "other" }, "1", http.StatusOK, true},
		{"store down", failing{}, nil, "9", http.StatusServiceUnavailable, false},
		{"nil guard", nil, nil, "9", http.StatusInternalServerError, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			h := fence.Middleware(c.guard, c.res)(ok)
			req := httptest.NewRequest(http.MethodPut, "/r", strings.NewReader("v"))
			if c.header != "-" {
				req.Header.Set(fence.Header, c.header)
			}
			before := served.Load()
			rec := httptest.NewRecorder()
			h.ServeHTTP(rec, req)
			resp := rec.Result()
			if resp.StatusCode != c.status {
				t.Errorf("status = %d; want %d (%s)", resp.StatusCode, c.status, rec.Body)
			}
			if got := served.Load() > before; got != c.served {
				t.Errorf("handler served = %v; want %v", got, c.served)
			}
			err := fence.CheckResponse(resp)
			if c.status != http.StatusConflict {
				if err != nil {
					t.Errorf("CheckResponse = %v; want nil", err)
				}
				return
			}
			var se *fence.StaleError
			if !errors.As(err, &se) || se.Highest <= se.Token || strconv.FormatUint(se.Token, 10) != c.header {
				t.Errorf("CheckResponse = %v; want a StaleError for token %s", err, c.header)
			}
			if body := rec.Body.String(); !strings.Contains(body, "token "+c.header+" is below") {
				t.Errorf("body = %q; want the tokens", body)
			}
		})
	}
	// A 409 of the handler's own is not a refusal.
	resp := &http.Response{StatusCode: http.StatusConflict, Header: http.Header{}}
	if err := fence.CheckResponse(resp); err != nil {
		t.Errorf("CheckResponse(plain 409) = %v; want nil", err)
	}
}

// TestMiddlewareConcurrent sends PUTs with interleaved tokens from many
// goroutines to a service whose handler does a slow read-modify-write
// of its value (it yields between the read and the write). Every write
// the handler makes must carry a token no lower than the one before (an
// older token never overtakes a newer one), the final value must be the
// highest accepted token's, and every refusal a 409 that CheckResponse
// turns into ErrStale with a higher token.
func TestMiddlewareConcurrent(t *testing.T) {
	const workers, rounds = 8, 150
	var (
		mu      sync.Mutex
		value   uint64
		applied []uint64
	)
	handler := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, err := io.ReadAll(r.Body)
		if err != nil {
			t.Error(err)
			return
		}
		tok, _ := strconv.ParseUint(string(b), 10, 64)
		mu.Lock()
		cur := value
		mu.Unlock()
		runtime.Gosched() // the handler's work, between its read and its write
		_ = cur
		mu.Lock()
		value = tok
		applied = append(applied, tok)
		mu.Unlock()
	})
	srv := httptest.NewServer(fence.Middleware(new(fence.Local), nil)(handler))
	t.Cleanup(srv.Close)

	var next, highest, refused atomic.Uint64
	var wg sync.WaitGroup
	for w := range workers {
		wg.Go(func() {
			rnd := rand.New(rand.NewPCG(11, uint64(w)))
			for range rounds {
				tok := max(next.Add(1), 4) - uint64(rnd.IntN(4))
				req, err := http.NewRequest(http.MethodPut, srv.URL+"/doc", strings.NewReader(strconv.FormatUint(tok, 10)))
				if err != nil {
					t.Error(err)
					return
				}
				req.Header.Set(fence.Header, strconv.FormatUint(tok, 10))
				resp, err := srv.Client().Do(req)
				if err != nil {
					t.Error(err)
					return
				}
				_, _ = io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				switch err := fence.CheckResponse(resp); {
				case resp.StatusCode == http.StatusOK:
					raise(&highest, tok)
				case errors.Is(err, fence.ErrStale):
					refused.Add(1)
					if se := err.(*fence.StaleError); se.Highest <= tok || se.Token != tok {
						t.Errorf("refusal of %d: %+v", tok, se)
					}
				default:
					t.Errorf("token %d: status %d, %v", tok, resp.StatusCode, err)
				}
			}
		})
	}
	wg.Wait()
	mu.Lock()
	defer mu.Unlock()
	for i := 1; i < len(applied); i++ {
		if applied[i] < applied[i-1] {
			t.Fatalf("write %d with token %d applied after one with %d", i, applied[i], applied[i-1])
		}
	}
	if value != highest.Load() {
		t.Errorf("value = %d; want %d, the highest accepted token", value, highest.Load())
	}
	if got := uint64(len(applied)) + refused.Load(); got != workers*rounds {
		t.Errorf("%d applied + %d refused; want %d", len(applied), refused.Load(), workers*rounds)
	}
	if refused.Load() == 0 {
		t.Errorf("no refusal: the tokens did not interleave")
	}
	t.Logf("%d applied, %d refused", len(applied), refused.Load())
}

// TestMiddlewareGiveUp: a request waiting for a resource's lock gives up
// when its context ends, and the handler holding the lock is not
// disturbed.
func TestMiddlewareGiveUp(t *testing.T) {
	inside, release := make(chan struct{}), make(chan struct{})
	h := fence.Middleware(new(fence.Local), nil)(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get(fence.Header) == "1" {
			close(inside)
			<-release
		}
		fmt.Fprint(w, "done")
	}))
	first := make(chan *httptest.ResponseRecorder)
	go func() {
		req := httptest.NewRequest(http.MethodPut, "/r", nil)
		req.Header.Set(fence.Header, "1")
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		first <- rec
	}()
	<-inside
	ctx, cancel := context.WithCancel(context.Background())
	req := httptest.NewRequest(http.MethodPut, "/r", nil).WithContext(ctx)
	req.Header.Set(fence.Header, "2")
	rec := httptest.NewRecorder()
	done := make(chan struct{})
	go func() { h.ServeHTTP(rec, req); close(done) }()
	cancel()
	<-done
	if rec.Code != http.StatusServiceUnavailable {
		t.Errorf("waiting request whose context ended: %d; want 503", rec.Code)
	}
	close(release)
	if r := <-first; r.Code != http.StatusOK || r.Body.String() != "done" {
		t.Errorf("first request: %d %q; want 200 done", r.Code, r.Body)
	}
	// The resource is free again, and token 2 was never checked.
	req = httptest.NewRequest(http.MethodPut, "/r", nil)
	req.Header.Set(fence.Header, "2")
	rec = httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	if rec.Code != http.StatusOK {
		t.Errorf("after: %d; want 200", rec.Code)
	}
}
