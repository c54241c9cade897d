package fence

import (
	"context"
	"errors"
	"net/http"
	"strconv"
	"sync"
)

// The HTTP convention: a client sends its token in the request header
// Header, in decimal ("Fencing-Token: 42"); a service that refuses it as
// stale answers 409 Conflict with the refused token in Header and the
// highest accepted one in HighestHeader, and the error's text as a
// text/plain body. [Middleware] is the service's side, [CheckResponse]
// the client's.
const (
	Header        = "Fencing-Token"
	HighestHeader = "Fencing-Token-Highest"
)

// Middleware returns net/http middleware that admits a request to the
// handler it wraps only if the request's token passes g for the resource
// that resource(r) names (nil: the request's URL path). It answers,
// without calling the handler:
//
//   - 428 Precondition Required when the request has no [Header];
//   - 400 Bad Request when the header is not a decimal token above 0, or
//     the resource is empty;
//   - 409 Conflict with both tokens (see [Header]) when g refuses the
//     token as stale;
//   - 503 Service Unavailable when g fails otherwise (the error is not
//     shown), or 500 when g is nil.
//
// The check and the handler run under a lock of this middleware per
// resource, so that for a service running as one process the handler's
// writes are atomic with the check: a request whose token passed finishes
// before the next request for the resource is checked, and a newer token
// is never overtaken by an older one. The lock is given up, unchecked,
// when the request's context ends while it waits. A handler must not
// call, directly or not, its own service for the same resource: it would
// wait for itself. Where several processes serve a resource, this lock
// does not span them: check inside the writes themselves ([SQL.Check],
// the Redis store's Fence) instead.
func Middleware(g Guard, resource func(*http.Request) string) func(http.Handler) http.Handler {
	if resource == nil {
		resource = func(r *http.Request) string { return r.URL.Path }
	}
	gates := &gates{m: make(map[string]*gate)}
	return func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if g == nil {
				http.Error(w, "fence: Middleware with a nil Guard", http.StatusInternalServerError)
				return
			}
			h := r.Header.Get(Header)
			if h == "" {
				http.Error(w, "fence: no "+Header+" header", http.StatusPreconditionRequired)
				return
			}
			token, err := strconv.ParseUint(h, 10, 64)
			if err != nil || token == 0 {
				http.Error(w, "fence: "+Header+" "+strconv.Quote(h)+" is not a token (a decimal number above 0)", http.StatusBadRequest)
				return
			}
			res := resource(r)
			if res == "" {
				http.Error(w, "fence: empty resource", http.StatusBadRequest)
				return
			}
			leave, err := gates.enter(r.Context(), res)
			if err != nil {
				http.Error(w, "fence: "+err.Error(), http.StatusServiceUnavailable)
				return
			}
			defer leave()
			if err := g.Check(r.Context(), res, token); err != nil {
				var stale *StaleError
				if errors.As(err, &stale) {
					w.Header().Set(Header, strconv.FormatUint(stale.Token, 10))
					w.Header().Set(HighestHeader, strconv.FormatUint(stale.Highest, 10))
					http.Error(w, stale.Error(), http.StatusConflict)
					return
				}
				http.Error(w, "fence: the token could not be checked", http.StatusServiceUnavailable)
				return
			}
			next.ServeHTTP(w, r)
		})
	}
}

// CheckResponse returns a [*StaleError] (its Resource empty) when resp is
// a refusal of a stale token by [Middleware]: 409 Conflict with both
// token headers. It returns nil for any other response, whose status is
// the caller's to judge. It reads only resp's status and headers.
func CheckResponse(resp *http.Response) error {
	if resp == nil || resp.StatusCode != http.StatusConflict {
		return nil
	}
	token, err1 := strconv.ParseUint(resp.Header.Get(Header), 10, 64)
	highest, err2 := strconv.ParseUint(resp.Header.Get(HighestHeader), 10, 64)
	if err1 != nil || err2 != nil {
		return nil // a 409 of the handler's own
	}
	return &StaleError{Token: token, Highest: highest}
}

// gates are the per-resource locks of one Middleware. A resource's gate
// exists while a request holds it or waits for it.
type gates struct {
	mu sync.Mutex
	m  map[string]*gate
}

type gate struct {
	slot  chan struct{} // holds one value while a request is inside
	users int           // requests inside or waiting; guarded by gates.mu
}

// enter waits until the request is alone inside resource's gate, or ctx
// ends (then it returns ctx's error, having taken nothing). The returned
// func lets the next one in.
func (gs *gates) enter(ctx context.Context, resource string) (leave func(), err error) {
	gs.mu.Lock()
	g := gs.m[resource]
	if g == nil {
		g = &gate{slot: make(chan struct{}, 1)}
		gs.m[resource] = g
	}
	g.users++
	gs.mu.Unlock()
	select {
	case g.slot <- struct{}{}:
		return func() {
			<-g.slot
			gs.drop(resource, g)
		}, nil
	case <-ctx.Done():
		gs.drop(resource, g)
		return nil, ctx.Err()
	}
}

func (gs *gates) drop(resource string, g *gate) {
	gs.mu.Lock()
	defer gs.mu.Unlock()
	if g.users--; g.users == 0 {
		delete(gs.m, resource)
	}
}
