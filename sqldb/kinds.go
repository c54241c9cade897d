package sqldb

import (
	"cmp"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"time"
	"unicode/utf8"
	"unsafe"

	"github.com/distlock/distlock/backend"
)

// Kinds of row in the kinds table (table_kinds): the kind column. A key's
// mutex, semaphore and read/write lock are distinct rows, so distinct
// locks.
const (
	// rowMutex: a mutex whose key the main table cannot hold
	// (PostgreSQL: a key with a NUL byte or invalid UTF-8); MySQL: a
	// fencing counter of the kinds table.
	rowMutex = 0
	rowSem   = 1 // a semaphore: its holders in state
	rowRW    = 2 // a read/write lock: its holders and intents in state
)

// kindsSuffix names the kinds table after the main one.
const kindsSuffix = "_kinds"

// groupRow is the kinds-table row of a semaphore or read/write lock.
func groupRow(k backend.Kind) int {
	if k == backend.KindSemaphore {
		return rowSem
	}
	return rowRW
}

// recordsIntent reports whether a refused attempt of l may record an
// intent: one of a read/write lock's sides, or of a semaphore's
// acquisition that waits in line (l.Waits).
func recordsIntent(l *backend.Lease) bool {
	return l.Kind == backend.KindRead || l.Kind == backend.KindWrite || l.Kind == backend.KindSemaphore && l.Waits
}

// groupIntentLife is the life, in microseconds, of the intent a refused
// attempt of l records in a group's row (0: none): l.TTL for a read or
// write request; for a semaphore's, life (see intentLife) when its
// acquisition waits in line.
func groupIntentLife(l *backend.Lease, life time.Duration) int64 {
	switch {
	case l.Kind != backend.KindSemaphore:
		return micros(l.TTL)
	case l.Waits && life > 0:
		return micros(life)
	}
	return 0
}

// mode is how a grant of kind k is written in a group's state: "s" a
// semaphore's permit, "r" a read grant, "w" a write grant.
func mode(k backend.Kind) string {
	switch k {
	case backend.KindSemaphore:
		return "s"
	case backend.KindRead:
		return "r"
	}
	return "w"
}

// A group row's state, as JSON: {"h": holders, "i": intents}. Times are
// microseconds since 1970 by the database's clock; owner values (MySQL)
// and labels (both) hex-encoded, so any bytes fit in JSON.
type groupState struct {
	H []groupEntry `json:"h"`
	I []groupEntry `json:"i"`
}

type groupEntry struct {
	O string `json:"o"` // owner value (MySQL: hex)
	K string `json:"k"` // "s", "r", "w"
	T uint64 `json:"t"` // token (holders)
	S uint64 `json:"s"` // arrival number (intents)
	E int64  `json:"e"` // expiry, microseconds since 1970
	L string `json:"l"` // label, hex
}

// inspection turns a group row's state read at now (microseconds since
// 1970 by the database's clock) into its live holders.
func (st groupState) inspection(now int64, lim int) (backend.Inspection, error) {
	var in backend.Inspection
	for _, h := range st.H {
		if h.E <= now {
			continue
		}
		label, err := hex.DecodeString(h.L)
		if err != nil {
			return in, fmt.Errorf("a holder's label %q: %w", h.L, err)
		}
		k := backend.KindWrite
		switch h.K {
		case "s":
			k = backend.KindSemaphore
		case "r":
			k = backend.KindRead
		}
		in.Holders = append(in.Holders, backend.Holder{Kind: k, Token: h.T, TTL: time.Duration(h.E-now) * time.Microsecond, Label: string(label)})
	}
	slices.SortFunc(in.Holders, func(a, b backend.Holder) int { return cmp.Compare(a.Token, b.Token) })
	if len(in.Holders) > 0 && lim > 0 {
		in.Limit = lim
	}
	return in, nil
}

func parseState(b []byte) (groupState, error) {
	var st groupState
	if len(b) == 0 {
		return st, nil
	}
	if err := json.Unmarshal(b, &st); err != nil {
		return st, fmt.Errorf("a lock's state: %w", err)
	}
	return st, nil
}

// textKey reports whether key fits a PostgreSQL text column: valid UTF-8
// without NUL. Such keys' mutexes live in the main table; the others' in
// the kinds table, whose keys are bytes.
func textKey(key string) bool {
	return utf8.ValidString(key) && strings.IndexByte(key, 0) < 0
}

// notifyPayload is the release notice's payload for key: the key itself
// when it is text, else `\x` and its bytes in hex (a NOTIFY payload is
// text). The listener wakes the subscribers of both readings of a
// payload that could be either: a notice is a hint, a spurious one costs
// an attempt.
func notifyPayload(key string) string {
	if textKey(key) {
		return key
	}
	return `\x` + hex.EncodeToString([]byte(key))
}

// payloadKeys returns the keys a notice's payload may stand for.
func payloadKeys(payload string) (key, alt string, ok bool) {
	if h, found := strings.CutPrefix(payload, `\x`); found {
		if b, err := hex.DecodeString(h); err == nil && !textKey(string(b)) {
			return payload, string(b), true
		}
	}
	return payload, "", false
}

// bytesArg passes a string as a bytea parameter (pgx encodes []byte and
// BytesValuer as bytea, not strings), without copying it.
type bytesArg string

// BytesValue implements pgtype.BytesValuer. pgx only reads the bytes.
func (b bytesArg) BytesValue() ([]byte, error) {
	if b == "" {
		return []byte{}, nil
	}
	return unsafe.Slice(unsafe.StringData(string(b)), len(b)), nil
}

// errLimitMismatch wraps backend.ErrLimitMismatch with the limits.
func errLimitMismatch(key string, want, held int) error {
	return fmt.Errorf("sqldb: semaphore %s: acquired with limit %d, held with %d: %w", shortQuote(key), want, held, backend.ErrLimitMismatch)
}
