package harness

import (
	"context"
	"path/filepath"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/distlock/distlock"
	"github.com/distlock/distlock/safety/history"
	"github.com/distlock/distlock/safety/resource"
)

// Client is a participant in the test's own process, for faults that hit
// the servers only: it records into the run's history like a worker.
type Client struct {
	Name  string
	rec   *history.Recorder
	store *resource.Client
	n     int

	mu     sync.Mutex
	doneAt map[string]*atomic.Int64 // owner -> when Done was seen closed
}

// Client returns an in-process participant named name.
func (r *Run) Client(name string) *Client {
	r.t.Helper()
	rec, err := history.Create(filepath.Join(r.Dir, name+".jsonl"), name)
	if err != nil {
		r.t.Fatal(err)
	}
	store, err := resource.Dial(r.sock)
	if err != nil {
		r.t.Fatal(err)
	}
	r.t.Cleanup(func() { _ = store.Close(); _ = rec.Close() })
	return &Client{Name: name, rec: rec, store: store}
}

// TryLock acquires key through d and records it. It returns the lock and
// its owner name (name-n).
func (c *Client) TryLock(ctx context.Context, d *distlock.DistributeLock, key string, wait time.Duration) (*distlock.Lock, string, error) {
	owner := c.Name + "-" + strconv.Itoa(c.n)
	c.n++
	call := history.Now()
	lk, err := d.TryLock(ctx, key, wait)
	ev := history.Event{Kind: history.Acquire, Owner: owner, Call: call, Return: history.Now(), Err: errString(err)}
	if err == nil {
		ev.Token = lk.Token()
	}
	if rerr := c.rec.Add(ev); rerr != nil {
		return nil, owner, rerr
	}
	if err == nil {
		at := new(atomic.Int64)
		c.mu.Lock()
		if c.doneAt == nil {
			c.doneAt = map[string]*atomic.Int64{}
		}
		c.doneAt[owner] = at
		c.mu.Unlock()
		go func() { <-lk.Done(); at.Store(history.Now()) }()
	}
	return lk, owner, err
}

// Unlock releases lk and records it, and the loss of lk if its Done had
// closed before.
func (c *Client) Unlock(ctx context.Context, lk *distlock.Lock, owner string) error {
	call := history.Now()
	c.mu.Lock()
	at := c.doneAt[owner]
	c.mu.Unlock()
	if at != nil {
		if t := at.Load(); t != 0 && t < call {
			if err := c.rec.Add(history.Event{Kind: history.Lost, Owner: owner, At: t}); err != nil {
				return err
			}
		}
	}
	err := lk.Unlock(ctx)
	if rerr := c.rec.Add(history.Event{Kind: history.Release, Owner: owner, Call: call, Return: history.Now(), Err: errString(err)}); rerr != nil {
		return rerr
	}
	return err
}

// Write makes a fenced write as owner with token and records it.
func (c *Client) Write(ctx context.Context, owner string, token uint64) (bool, error) {
	call := history.Now()
	ok, seq, err := c.store.Write(ctx, owner, token)
	if err != nil {
		return false, err
	}
	return ok, c.rec.Add(history.Event{Kind: history.Write, Owner: owner, Token: token, Call: call, Return: history.Now(), Accepted: ok, Seq: seq})
}
