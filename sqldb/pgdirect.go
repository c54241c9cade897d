package sqldb

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"hash/fnv"
	"strconv"
	"time"
	"unsafe"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/distlock/distlock/backend"
)

// The hot statements of a mutex (the acquire and the common release) go
// to the server through pgconn, pgx's wire layer: each is prepared once
// per connection under a name of its own (pgx.Conn.Prepare, a map lookup
// once prepared), and sent with its parameters and results in binary
// where that is cheaper than text. That skips pgx's encoding and scanning
// plans: 16 allocations and a few microseconds of client CPU per cycle
// (BenchmarkPostgresCycle). The pool's tracer (pgx's QueryTracer: a
// test's counter, OpenTelemetry), if any, is called for them as pgx's
// query path would (TraceQueryStart and TraceQueryEnd, with the SQL and
// the arguments).

// stmtName names a statement prepared on a connection: distlock_ and a
// hash of its text, so that two texts never share a name.
func stmtName(sql string) string {
	h := fnv.New64a()
	h.Write([]byte(sql))
	return "distlock_" + strconv.FormatUint(h.Sum64(), 36)
}

// Parameter formats of the direct statements (0 text, 1 binary): the
// acquire's key (text, or bytea in binary), owner, TTL and bound (int8),
// label (bytea), waits (bool), an intent's life (int8); the release's key
// and owner.
var (
	acqFormats    = []int16{0, 0, 1, 1, 1, 1, 1}
	acqOddFormats = []int16{1, 0, 1, 1, 1, 1, 1}
	relFormats    = []int16{0, 0}
	relOddFormats = []int16{1, 0}
	binaryResults = []int16{1}
)

// pgCall is the state of one acquire statement: the parameters'
// buffers, and, as the statement's context, the caller's values without
// its cancellation (what context.WithoutCancel gives, in the same
// allocation): TryAcquire cuts the statement off itself.
type pgCall struct {
	parent context.Context
	life   time.Duration // an intent's life (see intentLife)
	params [7][]byte
	ints   [25]byte
}

func (c *pgCall) Deadline() (time.Time, bool) { return time.Time{}, false }
func (c *pgCall) Done() <-chan struct{}       { return nil }
func (c *pgCall) Err() error                  { return nil }
func (c *pgCall) Value(key any) any           { return c.parent.Value(key) }

// strBytes returns s's bytes without copying them; pgconn only reads them.
func strBytes(s string) []byte {
	if s == "" {
		return []byte{}
	}
	return unsafe.Slice(unsafe.StringData(s), len(s))
}

// acquireDirect runs a mutex's acquire statement on c through pgconn.
func (p *Postgres) acquireDirect(ctx context.Context, call *pgCall, c *pgxpool.Conn, l *backend.Lease, bound int64) (r pgReply) {
	m := p.mutex(l.Key)
	conn := c.Conn()
	// An attempt queues only when its acquisition waits and has time
	// left for it (intentLife); otherwise the smaller acqAlone.
	queues := l.Waits && call.life > 0
	sql, name, n := m.acqAlone, m.acqAloneName, 5
	if queues {
		sql, name, n = m.acq, m.acqName, 7
	}
	sd, err := conn.Prepare(ctx, name, sql)
	if err != nil {
		r.err = err
		return r
	}
	formats := acqFormats
	if m == &p.odd {
		formats = acqOddFormats
	}
	if p.tracer != nil {
		args := []any{keyArg(l.Key), l.Value, micros(l.TTL), bound, bytesArg(l.Label), true, micros(call.life)}
		ctx = p.tracer.TraceQueryStart(ctx, conn, pgx.TraceQueryStartData{SQL: sql, Args: args[:n]})
		defer func() {
			p.tracer.TraceQueryEnd(ctx, conn, pgx.TraceQueryEndData{Err: r.err})
		}()
	}
	binary.BigEndian.PutUint64(call.ints[:8], uint64(micros(l.TTL)))
	binary.BigEndian.PutUint64(call.ints[8:], uint64(bound))
	call.ints[16] = 1
	binary.BigEndian.PutUint64(call.ints[17:], uint64(micros(call.life)))
	call.params = [7][]byte{strBytes(l.Key), strBytes(l.Value), call.ints[:8], call.ints[8:16], strBytes(l.Label), call.ints[16:17], call.ints[17:]}
	rr := conn.PgConn().ExecStatement(ctx, sd, call.params[:n], formats[:n], binaryResults)
	rows := 0
	for rr.NextRow() {
		v := rr.Values()
		switch {
		case len(v) == 3 && len(v[0]) == 1 && len(v[1]) == 8 && len(v[2]) == 8: // acqAlone
			r.token = int64(binary.BigEndian.Uint64(v[1]))
			r.left = int64(binary.BigEndian.Uint64(v[2]))
			r.ours, r.waited = r.left == -1, v[0][0] != 0
			rows++
		case len(v) == 5 && len(v[0]) == 1 && len(v[1]) == 8 && (v[2] == nil || len(v[2]) == 8) && len(v[4]) == 8: // acq
			r.token = int64(binary.BigEndian.Uint64(v[1]))
			r.waited = v[0][0] != 0
			holder := int64(-2) // none: the row is free
			if v[2] != nil {
				holder = int64(binary.BigEndian.Uint64(v[2]))
			}
			r.ours = holder == -1
			if !r.ours {
				r.left, r.err = queueLapse(holder, v[3], l.Value, int64(binary.BigEndian.Uint64(v[4])))
			} else {
				r.left = -1
			}
			rows++
		}
	}
	if _, err := rr.Close(); err != nil {
		r.err = err // the statement's error first: a reply to parse is incomplete then
	}
	if r.err == nil && rows == 0 {
		r.err = pgx.ErrNoRows
	}
	return r
}

// relFastDirect runs a mutex's common release statement through pgconn,
// on c, and returns the rows it deleted.
func (p *Postgres) relFastDirect(ctx context.Context, c *pgxpool.Conn, m *pgMutexSQL, l *backend.Lease) (n int64, err error) {
	conn := c.Conn()
	if p.tracer != nil {
		ctx = p.tracer.TraceQueryStart(ctx, conn, pgx.TraceQueryStartData{SQL: m.relFast, Args: []any{keyArg(l.Key), l.Value}})
		defer func() {
			p.tracer.TraceQueryEnd(ctx, conn, pgx.TraceQueryEndData{Err: err})
		}()
	}
	sd, err := conn.Prepare(ctx, m.relFastName, m.relFast)
	if err != nil {
		return 0, err
	}
	formats := relFormats
	if m == &p.odd {
		formats = relOddFormats
	}
	params := [2][]byte{strBytes(l.Key), strBytes(l.Value)}
	tag, err := conn.PgConn().ExecStatement(ctx, sd, params[:], formats, nil).Close()
	return tag.RowsAffected(), err
}

// queueLapse is acq's hint to a refused attempt of owner, in microseconds:
// the holder's time left (holder; -2 when nobody holds), or, when sooner,
// the time until the last of the live intents that precede owner's in
// queue lapses, by the server's clock now; 0 when neither applies. queue
// is the row's queue as jsonb in binary (a version byte, then the text),
// nil for none.
func queueLapse(holder int64, queue []byte, owner string, now int64) (int64, error) {
	left, some := holder, holder >= 0
	if len(queue) > 1 {
		if queue[0] != 1 {
			return 0, fmt.Errorf("sqldb: postgres: queue in jsonb format %d", queue[0])
		}
		var q []struct {
			O string `json:"o"`
			S int64  `json:"s"`
			E int64  `json:"e"`
		}
		if err := json.Unmarshal(queue[1:], &q); err != nil {
			return 0, fmt.Errorf("sqldb: postgres: queue: %w", err)
		}
		own := -1
		for i := range q {
			if q[i].O == owner {
				own = i
				break
			}
		}
		if own >= 0 {
			last, found := int64(0), false
			for _, x := range q {
				if x.S < q[own].S && (!found || x.E > last) {
					last, found = x.E, true
				}
			}
			if found && (!some || last-now < left) {
				left, some = last-now, true
			}
		}
	}
	if !some {
		return 0, nil
	}
	return left, nil
}
