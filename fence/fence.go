package fence

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"

	"github.com/distlock/distlock/backend"
)

// ErrStale is matched by errors.Is for every refusal of a stale token: the
// error is a [*StaleError], which carries both tokens.
var ErrStale = errors.New("fence: stale token")

// StaleError is the error of a check that found a token below the highest
// one the resource had accepted. errors.Is(err, ErrStale) holds for it.
type StaleError struct {
	// Resource is the fenced resource; empty when the refusal came over
	// HTTP (see [CheckResponse]).
	Resource string
	// Token is the token that was refused.
	Token uint64
	// Highest is the highest token the resource had accepted, above Token.
	Highest uint64
}

// Error says which token was refused and what the resource had accepted.
func (e *StaleError) Error() string {
	if e.Resource == "" {
		return fmt.Sprintf("fence: token %d is below %d, the highest accepted", e.Token, e.Highest)
	}
	return fmt.Sprintf("fence: %s: token %d is below %d, the highest accepted", strconv.Quote(e.Resource), e.Token, e.Highest)
}

// Unwrap returns [ErrStale].
func (e *StaleError) Unwrap() error { return ErrStale }

// A Guard keeps, for each resource, the highest token it has accepted.
//
// Check accepts token for resource when it is not below the highest token
// accepted for that resource before (an equal token passes: it is the same
// holder writing again) and records it as the highest; otherwise it
// returns a [*StaleError] and records nothing. Bad input (an empty
// resource, token 0) is an error wrapping distlock.ErrInvalid, returned
// before any I/O. Any other error is the store's, wrapped; the token may
// or may not have been recorded then.
//
// A check protects a write only when nothing can come between the two:
// [Middleware] runs its handler under a per-resource lock for that
// reason. Where the resource is a database, check inside the write's
// own transaction instead ([SQL.Check]; the Redis store's Fence writes
// by script).
//
// [*Local] and the Redis store's *Fence implement Guard. Implementations
// must be safe for concurrent use.
type Guard interface {
	Check(ctx context.Context, resource string, token uint64) error
}

// Validate returns the error a [Guard] returns for bad input, before any
// I/O: an empty resource or token 0 (what distlock.Lock.Token returns
// for a store without tokens, which cannot fence), wrapping
// distlock.ErrInvalid. It returns nil otherwise. Implementations of Guard
// outside this package call it first.
func Validate(resource string, token uint64) error {
	if resource == "" {
		return fmt.Errorf("fence: empty resource: %w", backend.ErrInvalid)
	}
	if token == 0 {
		return fmt.Errorf("fence: %s: token 0 (a lock without a token cannot fence): %w", strconv.Quote(resource), backend.ErrInvalid)
	}
	return nil
}

// Local is a [Guard] kept in this process's memory, for a service that is
// itself the resource (through [Middleware]). It keeps one entry per
// resource it has seen, for ever. The zero value is ready to use; a Local
// must not be copied after first use.
//
// Check alone does not make the caller's write atomic with it: two
// requests may pass their checks, the older first, and write in the other
// order. Use it through Middleware, or hold a lock of your own around the
// check and the write.
type Local struct {
	mu      sync.Mutex
	highest map[string]uint64
}

var _ Guard = (*Local)(nil)

// Check is [Guard.Check]; it does no I/O and ignores ctx.
func (l *Local) Check(_ context.Context, resource string, token uint64) error {
	if err := Validate(resource, token); err != nil {
		return err
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if h := l.highest[resource]; token < h {
		return &StaleError{Resource: resource, Token: token, Highest: h}
	}
	if l.highest == nil {
		l.highest = make(map[string]uint64)
	}
	l.highest[resource] = token
	return nil
}
