package sqldb

import (
	"context"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
)

// connGate is how an acquire attempt gets a connection from the pool
// without starting more new connections than are awaited.
//
// pgxpool's Acquire starts making a new connection whenever none is idle
// (up to MaxConns), and goes on making it when its caller's context ends
// first: the connection then lands in the pool, idle, later. An acquire
// attempt is bounded by its wait, which may be shorter than a new
// connection takes when the server is busy (200 ms waits; a fork and a
// backend's start on a server under load). Then every attempt, each
// ended at its bound, leaves one more connection being made: each
// process's pool grows to MaxConns, the server forks hundreds of
// backends, connections take seconds to make, and no attempt gets one
// within its wait. Measured at 12 processes x 4 goroutines, 200 ms
// waits: 240 connections made, 180 at once, in place of 60, and a grant
// rate near 1% (issue 36).
//
// So the gate keeps pgxpool's Acquire on the caller's goroutine while it
// answers within the attempt's bound (the lean path: nothing more than
// pgxpool's call). Once an Acquire was ended by its context, attempts go
// the slow way until the pool answers promptly again: acquisitions run
// in the background, bounded only by the store's life, no more of them
// than attempts wait for a connection, and the connection each gets goes
// to an attempt that waits for one (or back to the pool when none claims
// it within spareFor). So the connections being made on the attempts'
// account never outnumber the attempts that wait.
type connGate struct {
	slow     atomic.Bool  // an Acquire was ended by its context; cleared by a prompt one
	fetching atomic.Int32 // background acquisitions running
	waiting  atomic.Int32 // attempts waiting for one of their connections
	handoff  chan *pgxpool.Conn
	life     context.Context // ended by Close
	end      context.CancelFunc
	wg       sync.WaitGroup
}

const (
	// spareFor is how long a connection a background acquisition got
	// waits for an attempt to claim it before it goes back to the pool.
	spareFor = 100 * time.Millisecond
	// promptConn is how quick a background acquisition must be for the
	// pool to count as answering promptly again.
	promptConn = 10 * time.Millisecond
)

func (g *connGate) init() {
	g.handoff = make(chan *pgxpool.Conn)
	g.life, g.end = context.WithCancel(context.Background())
}

// close ends the background acquisitions and waits for them.
func (g *connGate) close() {
	g.end()
	g.wg.Wait()
}

// conn returns a connection of pool for an attempt bounded by ctx: ctx's
// error once it ends first.
func (g *connGate) conn(ctx context.Context, pool *pgxpool.Pool) (*pgxpool.Conn, error) {
	// A background acquisition waits for the connection pgxpool began
	// making for it, even once others are idle: idle ones are taken
	// here.
	if g.slow.Load() && pool.Stat().IdleConns() > 0 {
		g.slow.Store(false)
	}
	if !g.slow.Load() {
		c, err := pool.Acquire(ctx)
		if err != nil && ctx.Err() != nil {
			g.slow.Store(true)
		}
		return c, err
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	select {
	case c := <-g.handoff:
		return c, nil
	default:
	}
	// One acquisition more in the background only while fewer run than
	// attempts wait (this one included): those an attempt that left
	// started serve the next ones.
	waiting := g.waiting.Add(1)
	defer g.waiting.Add(-1)
	if g.fetching.Add(1) <= waiting {
		g.wg.Add(1)
		go g.fetch(pool)
	} else {
		g.fetching.Add(-1)
	}
	select {
	case c := <-g.handoff:
		return c, nil
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

// fetch acquires a connection for whichever attempt waits for one.
func (g *connGate) fetch(pool *pgxpool.Pool) {
	defer g.wg.Done()
	start := time.Now()
	c, err := pool.Acquire(g.life)
	g.fetching.Add(-1)
	if err != nil {
		return // closed, or the server refuses: the attempts' errors tell
	}
	if time.Since(start) < promptConn {
		g.slow.Store(false)
	}
	t := time.NewTimer(spareFor)
	defer t.Stop()
	select {
	case g.handoff <- c:
	case <-t.C:
		c.Release()
	case <-g.life.Done():
		c.Release()
	}
}
