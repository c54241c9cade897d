package sqldb

import (
	"context"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
)

// connGate is how the store's statements (acquire attempts, and the
// releases, renewals, withdrawals and clean-ups that hold no connection
// of their own: Postgres.connOr) get a connection from the pool without
// starting more new connections than calls wait for.
//
// pgxpool's Acquire starts making a new connection whenever none is idle
// (up to MaxConns), and goes on making it when its caller's context ends
// first: the connection lands in the pool, idle, later. An acquire
// attempt is bounded by its wait, which may be shorter than a new
// connection takes when the server is busy (200 ms waits; a fork and a
// backend's start on a server under load). Then every attempt, each
// ended at its bound, leaves one more connection being made: each
// process's pool grows to MaxConns, the server forks hundreds of
// backends, connections take seconds to make, and no attempt gets one
// within its wait. Measured at 12 processes x 4 goroutines, 200 ms
// waits: 240 connections made, 180 being made at once, in place of about
// 60, and 5-26 of 2400 attempts granted (issue 36).
//
// So an attempt calls pgxpool's Acquire at once (the lean path) until an
// Acquire is ended by its context. From then on, until an Acquire
// answers promptly again, an attempt calls Acquire only when the pool
// has an idle connection or fewer connections are being made than
// attempts wait for one; otherwise it looks again every connPoll, until
// its context ends. The connections being made on the attempts' account
// then never outnumber the attempts that wait.
type connGate struct {
	slow    atomic.Bool  // an Acquire was ended by its context; cleared by a prompt one
	waiting atomic.Int32 // attempts waiting in the slow way
}

const (
	// connPoll is how often an attempt waiting in the slow way looks at
	// the pool.
	connPoll = 5 * time.Millisecond
	// promptConn is how quick an Acquire must be for the pool to count
	// as answering promptly again.
	promptConn = 10 * time.Millisecond
)

// conn returns a connection of pool for an attempt bounded by ctx, or
// ctx's error once it ends first.
func (g *connGate) conn(ctx context.Context, pool *pgxpool.Pool) (*pgxpool.Conn, error) {
	if !g.slow.Load() {
		c, err := pool.Acquire(ctx)
		if err != nil && ctx.Err() != nil {
			g.slow.Store(true)
		}
		return c, err
	}
	waiting := g.waiting.Add(1)
	defer g.waiting.Add(-1)
	var t *time.Timer
	for {
		if st := pool.Stat(); st.IdleConns() > 0 || st.ConstructingConns() < waiting {
			start := time.Now()
			c, err := pool.Acquire(ctx)
			if err == nil && time.Since(start) < promptConn {
				g.slow.Store(false)
			}
			return c, err
		}
		if t == nil {
			t = time.NewTimer(connPoll)
			defer t.Stop()
		} else {
			t.Reset(connPoll)
		}
		select {
		case <-t.C:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
}
