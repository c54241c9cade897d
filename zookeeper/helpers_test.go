package zookeeper

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"io"
	"net"
	"reflect"
	"slices"
	"sort"
	"sync"
	"sync/atomic"
	"testing"
	"time"
	"unsafe"

	"github.com/go-zookeeper/zk"

	"github.com/distlock/distlock/backend"
)

// run runs each test as a subtest of t, all against one server.
func run(t *testing.T, addrs []string, tests []namedTest) {
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) { tt.fn(t, addrs) })
	}
}

type namedTest struct {
	name string
	fn   func(t *testing.T, addrs []string)
}

// sessionTimeout is what the tests ask for; the server must allow it
// (tickTime <= 1s).
const sessionTimeout = 2 * time.Second

type silentLogger struct{}

func (silentLogger) Printf(string, ...any) {}

// connOpts are the connection's test hooks.
type connOpts struct {
	dialer  zk.Dialer        // default net.DialTimeout
	events  zk.EventCallback // default none
	timeout time.Duration    // default sessionTimeout
}

// connect opens a connection closed at cleanup, waiting for its session.
func connect(t testing.TB, addrs []string) *zk.Conn {
	t.Helper()
	return connectWith(t, addrs, connOpts{})
}

func connectWith(t testing.TB, addrs []string, o connOpts) *zk.Conn {
	t.Helper()
	if o.dialer == nil {
		o.dialer = net.DialTimeout
	}
	if o.events == nil {
		o.events = func(zk.Event) {}
	}
	if o.timeout == 0 {
		o.timeout = sessionTimeout
	}
	conn, _, err := zk.Connect(addrs, o.timeout, zk.WithLogger(silentLogger{}),
		zk.WithDialer(o.dialer), zk.WithEventCallback(o.events))
	if err != nil {
		t.Fatalf("zk.Connect: %v", err)
	}
	t.Cleanup(conn.Close)
	waitFor(t, 10*time.Second, "a session", func() bool { return conn.State() == zk.StateHasSession })
	return conn
}

// mustNew returns New(conn, opts...), failing t on an error.
func mustNew(t testing.TB, conn *zk.Conn, opts ...Option) *Resource {
	t.Helper()
	r, err := New(conn, opts...)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// newResource returns a resource over a fresh connection, closed at cleanup.
func newResource(t testing.TB, addrs []string, opts ...Option) (*Resource, *zk.Conn) {
	t.Helper()
	conn := connect(t, addrs)
	r := mustNew(t, conn, opts...)
	t.Cleanup(func() { _ = r.Close() })
	return r, conn
}

// waitFor polls cond until it holds or fails the test after d.
func waitFor(t testing.TB, d time.Duration, what string, cond func() bool) {
	t.Helper()
	end := time.Now().Add(d)
	for !cond() {
		if time.Now().After(end) {
			t.Fatalf("timed out after %v waiting for %s", d, what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// uniqueKey is a key no other test uses.
func uniqueKey(t testing.TB) string {
	var b [6]byte
	_, _ = rand.Read(b[:])
	return t.Name() + "/" + hex.EncodeToString(b[:])
}

// pathOf is the znode path of the lock l holds ("" if none).
func pathOf(l *backend.Lease) string {
	if h, ok := l.Handle.(*held); ok && h != nil {
		return h.path()
	}
	return ""
}

func lease(key string, ttl time.Duration) *backend.Lease {
	var b [16]byte
	_, _ = rand.Read(b[:])
	return &backend.Lease{Key: key, Value: hex.EncodeToString(b[:]), TTL: ttl}
}

// children lists what the store holds for key (nil when the parent is gone).
func children(conn *zk.Conn, r *Resource, key string) ([]string, error) {
	cs, _, err := conn.Children(r.parentPath(key))
	if errors.Is(err, zk.ErrNoNode) {
		return nil, nil
	}
	sort.Slice(cs, func(i, j int) bool {
		a, _, _ := sequence(cs[i])
		b, _, _ := sequence(cs[j])
		return seqCompare(a, b) < 0
	})
	return cs, err
}

// allChildren lists the paths of what the store holds for key, of every
// kind of lock.
func allChildren(conn *zk.Conn, r *Resource, key string) ([]string, error) {
	var all []string
	for _, kind := range []backend.Kind{backend.KindMutex, backend.KindSemaphore, backend.KindWrite} {
		parent := r.kindParent(key, kind)
		cs, _, err := conn.Children(parent)
		switch {
		case errors.Is(err, zk.ErrNoNode):
			continue
		case err != nil:
			return nil, err
		}
		for _, c := range cs {
			all = append(all, parent+"/"+c)
		}
	}
	sort.Strings(all)
	return all, nil
}

func mustChildren(t testing.TB, conn *zk.Conn, r *Resource, key string) []string {
	t.Helper()
	cs, err := children(conn, r, key)
	if err != nil {
		t.Fatalf("children of %q: %v", key, err)
	}
	return cs
}

// faultDialer dials real connections to the server and injects the faults
// a real server cannot give on demand: a reply lost on a dropped
// connection, a network that refuses every connection, a silent network
// (nothing gets through either way, connections left open, as in a
// partition that sends no reset), and a create request held in the
// network while the client gives its connection up.
type faultDialer struct {
	dropCreateReply atomic.Bool // drop the reply of the next create, closing the connection
	dropped         atomic.Int32
	silent          atomic.Bool  // see silence
	holdCreate      atomic.Bool  // hold the next create request; the client sees its connection break
	refused         atomic.Int32 // dials refused while blocked

	mu       sync.Mutex
	blocked  bool
	conns    []*faultConn
	detached []*faultConn // connections the client gave up, still open to the server
}

func (d *faultDialer) dial(network, addr string, timeout time.Duration) (net.Conn, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.blocked {
		d.refused.Add(1)
		return nil, errors.New("faultDialer: network blocked")
	}
	c, err := net.DialTimeout(network, addr, timeout)
	if err != nil {
		return nil, err
	}
	fc := &faultConn{Conn: c, d: d}
	d.conns = append(d.conns, fc)
	return fc, nil
}

// block cuts every connection and refuses new ones until unblock.
func (d *faultDialer) block() {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.blocked = true
	for _, c := range d.conns {
		_ = c.Conn.Close()
	}
	d.conns = nil
}

func (d *faultDialer) unblock() {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.blocked = false
}

// silence holds every byte both ways, of open and new connections, until
// speak: like TCP over a partition, what was sent arrives late if the
// connection is still open then, and never if either side gave it up.
func (d *faultDialer) silence() { d.silent.Store(true) }

// speak ends the silence: held requests go on to the server, held replies
// reach the client with the next one.
func (d *faultDialer) speak() {
	d.mu.Lock()
	d.silent.Store(false)
	conns := slices.Clone(d.conns)
	d.mu.Unlock()
	for _, c := range conns {
		c.wmu.Lock()
		_ = c.flush()
		c.wmu.Unlock()
	}
}

// takeDetached returns the connections the client gave up while their
// server side stayed open, and forgets them.
func (d *faultDialer) takeDetached() []*faultConn {
	d.mu.Lock()
	defer d.mu.Unlock()
	cs := d.detached
	d.detached = nil
	return cs
}

// closeDetached closes what takeDetached would return (test cleanup).
func (d *faultDialer) closeDetached() {
	for _, c := range d.takeDetached() {
		_ = c.Conn.Close()
	}
}

// faultConn passes frames through, except the reply it was told to drop;
// while the dialer is silent, it holds them.
type faultConn struct {
	net.Conn
	d        *faultDialer
	dropXid  atomic.Int32
	inbox    [][]byte // frames from the server not passed on yet
	pending  []byte   // the rest of the frame being read by the client
	detached atomic.Bool
	held     []byte // the create request held when it was detached

	wmu    sync.Mutex
	outbox []byte // bytes to the server held by the silence
}

// flush sends the bytes the silence held. c.wmu is held.
func (c *faultConn) flush() error {
	if len(c.outbox) == 0 {
		return nil
	}
	_, err := c.Conn.Write(c.outbox)
	c.outbox = nil
	return err
}

// ZooKeeper's opcodes of the requests that create a lock's znode: the
// resource sends a multi (the create and a write of the parent's data).
const (
	opCreate = 1
	opMulti  = 14
)

// isCreate reports whether the frame p (length, xid, opcode, ...) may
// create a lock's znode.
func isCreate(p []byte) bool {
	if len(p) < 12 {
		return false
	}
	op := binary.BigEndian.Uint32(p[8:12])
	return op == opCreate || op == opMulti
}

var errDetached = errors.New("faultConn: connection given up (its server side stays open)")

func (c *faultConn) Write(p []byte) (int, error) {
	c.wmu.Lock()
	defer c.wmu.Unlock()
	switch {
	case c.detached.Load():
		return 0, errDetached
	case c.d.silent.Load():
		c.outbox = append(c.outbox, p...)
		return len(p), nil
	}
	if err := c.flush(); err != nil {
		return 0, err
	}
	// go-zookeeper writes one whole frame per call: length, xid, opcode.
	if isCreate(p) {
		if c.d.holdCreate.CompareAndSwap(true, false) {
			c.detach(p)
			return len(p), nil
		}
		if c.d.dropCreateReply.CompareAndSwap(true, false) {
			c.dropXid.Store(int32(binary.BigEndian.Uint32(p[4:8])))
		}
	}
	return c.Conn.Write(p)
}

// detach holds the request p and makes the client's reads fail at once,
// while the connection to the server stays open.
func (c *faultConn) detach(p []byte) {
	c.held = bytes.Clone(p)
	c.detached.Store(true)
	c.d.mu.Lock()
	c.d.detached = append(c.d.detached, c)
	c.d.mu.Unlock()
	_ = c.Conn.SetReadDeadline(time.Unix(1, 0)) // wakes the client's blocked read
}

func (c *faultConn) SetReadDeadline(t time.Time) error {
	if c.detached.Load() {
		return nil
	}
	return c.Conn.SetReadDeadline(t)
}

func (c *faultConn) Close() error {
	if c.detached.Load() {
		return nil // the client closes its side; the server's stays open
	}
	return c.Conn.Close()
}

func (c *faultConn) Read(p []byte) (int, error) {
	for len(c.pending) == 0 {
		if c.detached.Load() {
			return 0, errDetached
		}
		if len(c.inbox) > 0 && !c.d.silent.Load() {
			frame := c.inbox[0]
			c.inbox = c.inbox[1:]
			if x := c.dropXid.Load(); x != 0 && len(frame) >= 8 && int32(binary.BigEndian.Uint32(frame[4:8])) == x {
				c.dropXid.Store(0)
				c.d.dropped.Add(1)
				_ = c.Conn.Close()
				return 0, errors.New("faultConn: reply dropped")
			}
			c.pending = frame
			break
		}
		// Read the next frame (the client's read deadline applies): held
		// while silent, passed on in order otherwise.
		var hdr [4]byte
		if _, err := io.ReadFull(c.Conn, hdr[:]); err != nil {
			if c.detached.Load() {
				return 0, errDetached
			}
			return 0, err
		}
		frame := make([]byte, 4+binary.BigEndian.Uint32(hdr[:]))
		copy(frame, hdr[:])
		if _, err := io.ReadFull(c.Conn, frame[4:]); err != nil {
			return 0, err
		}
		c.inbox = append(c.inbox, frame)
	}
	n := copy(p, c.pending)
	c.pending = c.pending[n:]
	return n, nil
}

// serverClosed reads what the server still sends on a detached connection
// until it closes its side (true) or wait passes (false).
func (c *faultConn) serverClosed(wait time.Duration) bool {
	_ = c.Conn.SetReadDeadline(time.Now().Add(wait))
	_, err := io.Copy(io.Discard, c.Conn)
	return err == nil // io.Copy reports io.EOF as nil
}

// release sends the held request to the server, late.
func (c *faultConn) release() error {
	_, err := c.Conn.Write(c.held)
	return err
}

// clientWatchers counts the watches the client keeps for the caller: one
// per Get/Exists/ChildrenW that set a watch not yet fired. go-zookeeper
// keeps them to itself; a change there fails the test, not the count.
func clientWatchers(t testing.TB, conn *zk.Conn) int {
	t.Helper()
	v := reflect.ValueOf(conn).Elem()
	lock, watchers := v.FieldByName("watchersLock"), v.FieldByName("watchers")
	if !lock.IsValid() || !watchers.IsValid() || lock.Type() != reflect.TypeFor[sync.Mutex]() || watchers.Kind() != reflect.Map {
		t.Fatal("go-zookeeper changed: no Conn.watchersLock or Conn.watchers")
	}
	mu := (*sync.Mutex)(unsafe.Pointer(lock.UnsafeAddr()))
	mu.Lock()
	defer mu.Unlock()
	n := 0
	for it := watchers.MapRange(); it.Next(); {
		n += it.Value().Len()
	}
	return n
}

// pathWatchers returns how many watches the client conn holds on path, of
// any type.
func pathWatchers(t testing.TB, conn *zk.Conn, path string) int {
	t.Helper()
	v := reflect.ValueOf(conn).Elem()
	lock, watchers := v.FieldByName("watchersLock"), v.FieldByName("watchers")
	mu := (*sync.Mutex)(unsafe.Pointer(lock.UnsafeAddr()))
	mu.Lock()
	defer mu.Unlock()
	n := 0
	for it := watchers.MapRange(); it.Next(); {
		if p := it.Key().FieldByName("path"); p.IsValid() && p.String() == path {
			n += it.Value().Len()
		}
	}
	return n
}

// acquireAsync runs Acquire in a goroutine and reports its result.
func acquireAsync(ctx context.Context, r *Resource, l *backend.Lease, deadline time.Time) <-chan error {
	ch := make(chan error, 1)
	go func() { ch <- r.Acquire(ctx, l, deadline) }()
	return ch
}
