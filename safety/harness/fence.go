package harness

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"io"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"sync"

	"github.com/jackc/pgx/v5/pgconn"
	_ "github.com/jackc/pgx/v5/stdlib" // database/sql driver "pgx"
	goredis "github.com/redis/go-redis/v9"

	"github.com/distlock/distlock/fence"
	"github.com/distlock/distlock/redis"
	"github.com/distlock/distlock/safety/history"
)

// Fence is a fenced store written through distlock's public helpers, in
// place of the run's fenced register (package safety/resource): a Redis
// key written by redis.Fence, or a PostgreSQL table guarded by
// fence.Postgres inside each write's transaction. Unlike the register,
// such a store accepts a token equal to the last one from any owner (it
// knows tokens, not owners): duplicate tokens show in the token checks
// and in porcupine, not as refusals.
//
// The store's order and time of each write come back with it (a sequence
// drawn by the write, after its check, and the server's clock), so the
// checkers judge the store's order as they do the register's.
type Fence struct {
	// Kind is "redis" or "postgres"; empty: the run's register.
	Kind string
	// Addr is the store: the Redis server's host:port, or a postgres://
	// URL.
	Addr string
	// Socket is a Unix socket that forwards to Addr, which [Run.Worker]
	// fills in: a worker reaches the store through it, so that the store
	// stays reachable from a network namespace cut off by a partition, as
	// the register's socket does.
	Socket string
}

// The tables of a Fence on PostgreSQL: the fence table, and the log of
// accepted writes, whose seq is drawn after the check, under the
// resource's row lock, so in the order the writes commit.
const (
	pgFenceTable = "safety_fence"
	pgFenceLog   = "safety_fence_writes"
)

// fenceRegister is the fenced write on Redis: the register's value, the
// write's sequence and the server's time, after the fence's check.
var fenceRegister = redis.NewFencedScript(`redis.call('SET', KEYS[1], ARGV[1])
local t = redis.call('TIME')
return {redis.call('INCR', KEYS[2]), t[1], t[2]}`)

// FenceWriter makes fenced writes to a [Fence].
type FenceWriter struct {
	kind  string
	db    *sql.DB
	pg    *fence.SQL
	rdb   *goredis.Client
	fence *redis.Fence
}

// OpenFence connects to f's store, through f.Socket when set, else to
// f.Addr.
func OpenFence(ctx context.Context, f Fence) (*FenceWriter, error) {
	switch f.Kind {
	case "redis":
		opts := &goredis.Options{Addr: f.Addr, MaxRetries: -1}
		if f.Socket != "" {
			opts.Network, opts.Addr = "unix", f.Socket
		}
		rdb := goredis.NewClient(opts)
		rf, err := redis.NewFence(rdb)
		if err != nil {
			rdb.Close()
			return nil, err
		}
		return &FenceWriter{kind: f.Kind, rdb: rdb, fence: rf}, nil
	case "postgres":
		dsn := f.Addr
		if f.Socket != "" {
			var err error
			if dsn, err = viaSocket(f.Addr, f.Socket); err != nil {
				return nil, err
			}
		}
		dsn, err := boundIdleTx(dsn)
		if err != nil {
			return nil, err
		}
		db, err := sql.Open("pgx", dsn)
		if err != nil {
			return nil, fmt.Errorf("harness: fence: %w", err)
		}
		pg, err := fence.Postgres(pgFenceTable)
		if err != nil {
			db.Close()
			return nil, err
		}
		return &FenceWriter{kind: f.Kind, db: db, pg: pg}, nil
	}
	return nil, fmt.Errorf("harness: fence kind %q", f.Kind)
}

// Close closes the connections.
func (w *FenceWriter) Close() error {
	if w.db != nil {
		return w.db.Close()
	}
	return w.rdb.Close()
}

// Write writes owner's value to resource's register with token and
// returns the write as the store saw it: a [history.StoreWrite] event,
// with the store's sequence and time when accepted (the time of the
// write's return when refused: a refusal writes nothing). A refusal is
// not an error.
func (w *FenceWriter) Write(ctx context.Context, resource, owner string, token uint64) (history.Event, error) {
	ev := history.Event{Kind: history.StoreWrite, Owner: owner, Token: token}
	var err error
	if w.kind == "redis" {
		err = w.writeRedis(ctx, resource, owner, token, &ev)
	} else {
		err = w.writePostgres(ctx, resource, owner, token, &ev)
	}
	if errors.Is(err, fence.ErrStale) || idleTxEnded(err) {
		ev.At, err = history.Now(), nil
	}
	return ev, err
}

// idleTx bounds how long the fenced PostgreSQL keeps a writer's
// transaction that waits for its client: fence.SQL.Check locks the
// resource's row until the transaction ends, so a holder paused inside
// one (the scenarios' SIGSTOP) would keep every later holder's write
// waiting until it resumes. A resource guarded by a fence must bound its
// transactions so; the server then ends the paused writer's, which
// wrote nothing.
const idleTx = "3000" // milliseconds

// boundIdleTx returns the DSN with idle_in_transaction_session_timeout
// set to idleTx, a run-time parameter pgx sends at connect.
func boundIdleTx(dsn string) (string, error) {
	u, err := url.Parse(dsn)
	if err != nil {
		return "", fmt.Errorf("harness: fence: %w", err)
	}
	q := u.Query()
	q.Set("idle_in_transaction_session_timeout", idleTx)
	u.RawQuery = q.Encode()
	return u.String(), nil
}

// idleTxEnded reports whether err is the server ending a transaction that
// waited for its client longer than idleTx (SQLSTATE 25P03): rolled back,
// it wrote nothing, as a refused write.
func idleTxEnded(err error) bool {
	var pe *pgconn.PgError
	return errors.As(err, &pe) && pe.Code == "25P03"
}

func (w *FenceWriter) writeRedis(ctx context.Context, resource, owner string, token uint64, ev *history.Event) error {
	tag := "{" + resource + "}"
	r, err := w.fence.Run(ctx, fenceRegister, tag+":register", token, []string{tag + ":seq"}, owner).Int64Slice()
	if err != nil {
		return err
	}
	if len(r) != 3 {
		return fmt.Errorf("harness: fence: reply %v", r)
	}
	ev.Accepted, ev.Seq, ev.At = true, r[0], history.FromUnix(r[1]*1e9+r[2]*1e3)
	return nil
}

func (w *FenceWriter) writePostgres(ctx context.Context, resource, owner string, token uint64, ev *history.Event) error {
	tx, err := w.db.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	defer tx.Rollback()
	if err := w.pg.Check(ctx, tx, resource, token); err != nil {
		return err
	}
	var us int64
	if err := tx.QueryRowContext(ctx, `INSERT INTO `+pgFenceLog+` (resource, owner, token) VALUES ($1, $2, $3)
RETURNING seq, (extract(epoch FROM at) * 1000000)::bigint`, resource, owner, int64(token)).Scan(&ev.Seq, &us); err != nil {
		return err
	}
	if err := tx.Commit(); err != nil {
		return err
	}
	ev.Accepted, ev.At = true, history.FromUnix(us*1e3)
	return nil
}

// setUpFence makes what a Fence's writers need: on PostgreSQL, the
// tables.
func setUpFence(ctx context.Context, f Fence) error {
	if f.Kind != "postgres" {
		return nil
	}
	db, err := sql.Open("pgx", f.Addr)
	if err != nil {
		return err
	}
	defer db.Close()
	pg, err := fence.Postgres(pgFenceTable)
	if err != nil {
		return err
	}
	if err := pg.CreateTable(ctx, db); err != nil {
		return err
	}
	_, err = db.ExecContext(ctx, `CREATE TABLE IF NOT EXISTS `+pgFenceLog+` (
  seq      bigserial PRIMARY KEY,
  resource text NOT NULL,
  owner    text NOT NULL,
  token    bigint NOT NULL,
  at       timestamptz NOT NULL DEFAULT clock_timestamp()
)`)
	return err
}

// viaSocket rewrites a postgres:// URL to reach its server through the
// Unix socket path (named as PostgreSQL names its sockets:
// dir/.s.PGSQL.port).
func viaSocket(dsn, socket string) (string, error) {
	u, err := url.Parse(dsn)
	if err != nil {
		return "", fmt.Errorf("harness: fence: %w", err)
	}
	dir, name := filepath.Split(socket)
	port, ok := pgSocketPort(name)
	if !ok {
		return "", fmt.Errorf("harness: fence: socket %q is not named .s.PGSQL.<port>", socket)
	}
	q := u.Query()
	q.Set("host", filepath.Clean(dir))
	q.Set("port", port)
	u.Host, u.RawQuery = "", q.Encode()
	return u.String(), nil
}

func pgSocketPort(name string) (string, bool) {
	const prefix = ".s.PGSQL."
	if len(name) <= len(prefix) || name[:len(prefix)] != prefix {
		return "", false
	}
	_, err := strconv.Atoi(name[len(prefix):])
	return name[len(prefix):], err == nil
}

// forwarder accepts connections on a Unix socket and joins each to a new
// TCP connection to its target.
type forwarder struct {
	ln     net.Listener
	target string
	dir    string

	mu    sync.Mutex
	conns map[net.Conn]struct{}
	wg    sync.WaitGroup
}

// forward starts a forwarder to the fence's store in a fresh directory;
// the socket is named for the store's kind (PostgreSQL clients find a
// socket by directory and port).
func forward(f Fence) (*forwarder, string, error) {
	target, name := f.Addr, "redis.sock"
	if f.Kind == "postgres" {
		u, err := url.Parse(f.Addr)
		if err != nil {
			return nil, "", err
		}
		target, name = u.Host, ".s.PGSQL."+u.Port()
	}
	// Unix socket paths are short (108 bytes): not under t.TempDir.
	dir, err := os.MkdirTemp("", "dlfence")
	if err != nil {
		return nil, "", err
	}
	path := filepath.Join(dir, name)
	ln, err := net.Listen("unix", path)
	if err != nil {
		os.RemoveAll(dir)
		return nil, "", err
	}
	fw := &forwarder{ln: ln, target: target, dir: dir, conns: map[net.Conn]struct{}{}}
	fw.wg.Go(fw.accept)
	return fw, path, nil
}

func (fw *forwarder) accept() {
	for {
		c, err := fw.ln.Accept()
		if err != nil {
			return
		}
		up, err := net.Dial("tcp", fw.target)
		if err != nil {
			c.Close()
			continue
		}
		if !fw.track(c, up) {
			return
		}
		fw.wg.Go(func() { fw.pipe(c, up) })
		fw.wg.Go(func() { fw.pipe(up, c) })
	}
}

// track registers the pair, unless the forwarder is closing (then it
// closes them and reports false).
func (fw *forwarder) track(a, b net.Conn) bool {
	fw.mu.Lock()
	defer fw.mu.Unlock()
	if fw.conns == nil {
		a.Close()
		b.Close()
		return false
	}
	fw.conns[a], fw.conns[b] = struct{}{}, struct{}{}
	return true
}

// pipe copies from src to dst, then closes both and forgets them.
func (fw *forwarder) pipe(dst, src net.Conn) {
	_, _ = io.Copy(dst, src)
	dst.Close()
	src.Close()
	fw.mu.Lock()
	if fw.conns != nil {
		delete(fw.conns, dst)
		delete(fw.conns, src)
	}
	fw.mu.Unlock()
}

// close stops the forwarder, closes its connections and waits for them.
func (fw *forwarder) close() {
	fw.ln.Close()
	fw.mu.Lock()
	for c := range fw.conns {
		c.Close()
	}
	fw.conns = nil
	fw.mu.Unlock()
	fw.wg.Wait()
	os.RemoveAll(fw.dir)
}
