package proxy

import (
	"net"
	"sync"
	"time"
)

// Direction is one way through the proxy.
type Direction int

// The directions.
const (
	Up   Direction = iota // client to server
	Down                  // server to client
)

// Proxy forwards connections from Addr to a target address.
type Proxy struct {
	// Addr is where clients connect, "127.0.0.1:port".
	Addr string

	target string
	ln     net.Listener

	mu      sync.Mutex
	delay   [2]func() time.Duration
	stalled [2]bool
	holds   [2][]*Held // not yet taken, in the order they were asked for
	changed *sync.Cond // broadcast when stalled changes or the proxy closes
	closed  bool
	quit    chan struct{} // closed by Close
	conns   map[net.Conn]struct{}
	wg      sync.WaitGroup
}

// Held is one chunk held by [Proxy.Hold]: a packet stuck on the network
// for as long as the test wants.
type Held struct {
	match   func(chunk []byte) bool
	seen    chan struct{}
	release chan struct{}
	once    sync.Once
}

// Seen is closed when the proxy has read the chunk and holds it.
func (h *Held) Seen() <-chan struct{} { return h.seen }

// Release lets the chunk, and the later bytes of its connection, go on
// (after the direction's delay, if any). The chunk is written to the
// other end even when its sender closed the connection meanwhile, as
// bytes already on the network would arrive; when the other end is
// closed (CloseConns), it is dropped. Calls after the first do nothing.
func (h *Held) Release() { h.once.Do(func() { close(h.release) }) }

// Start listens on a free port of 127.0.0.1 and forwards to target.
func Start(target string) (*Proxy, error) { return StartOn("127.0.0.1:0", target) }

// StartOn listens on addr and forwards to target. Listen on loopback, or
// on an address private to this machine (the host end of a veth pair).
func StartOn(addr, target string) (*Proxy, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, err
	}
	p := &Proxy{Addr: ln.Addr().String(), target: target, ln: ln, conns: map[net.Conn]struct{}{}, quit: make(chan struct{})}
	p.changed = sync.NewCond(&p.mu)
	p.wg.Add(1)
	go p.accept()
	return p, nil
}

// SetDelay makes every chunk read in direction d wait f() before it is
// written on (chunks keep their order). nil: no delay.
func (p *Proxy) SetDelay(d Direction, f func() time.Duration) {
	p.mu.Lock()
	p.delay[d] = f
	p.mu.Unlock()
}

// Hold holds, in direction d, the next chunk read for which match
// returns true, on whatever connection, and the later bytes of that
// connection, until the returned Held is released or the proxy closes;
// the other connections flow on. Several Holds wait for a chunk each, in
// the order they were asked for: a chunk is taken by the first that
// matches it. match is called for every chunk until it matched, from the
// proxy's goroutines; it must not keep or change the chunk. A test uses
// it to delay one request it recognises by its bytes (a Redis command
// naming a script) past the requests sent after it on other connections.
func (p *Proxy) Hold(d Direction, match func(chunk []byte) bool) *Held {
	h := &Held{match: match, seen: make(chan struct{}), release: make(chan struct{})}
	p.mu.Lock()
	p.holds[d] = append(p.holds[d], h)
	p.mu.Unlock()
	return h
}

// take returns the first Hold of direction d that matches chunk, removed
// from the waiting ones, or nil.
func (p *Proxy) take(d Direction, chunk []byte) *Held {
	p.mu.Lock()
	defer p.mu.Unlock()
	for i, h := range p.holds[d] {
		if h.match(chunk) {
			p.holds[d] = append(p.holds[d][:i:i], p.holds[d][i+1:]...)
			return h
		}
	}
	return nil
}

// Stall holds every byte in direction d, of open and new connections,
// until Unstall.
func (p *Proxy) Stall(d Direction) {
	p.mu.Lock()
	p.stalled[d] = true
	p.mu.Unlock()
}

// Unstall lets direction d flow again, held bytes first.
func (p *Proxy) Unstall(d Direction) {
	p.mu.Lock()
	p.stalled[d] = false
	p.changed.Broadcast()
	p.mu.Unlock()
}

// CloseConns closes every open connection (new ones are still accepted).
func (p *Proxy) CloseConns() {
	p.mu.Lock()
	defer p.mu.Unlock()
	for c := range p.conns {
		c.Close()
	}
}

// Close stops the proxy and closes its connections.
func (p *Proxy) Close() error {
	err := p.ln.Close()
	p.mu.Lock()
	if !p.closed {
		close(p.quit)
	}
	p.closed = true
	p.changed.Broadcast()
	for c := range p.conns {
		c.Close()
	}
	p.mu.Unlock()
	p.wg.Wait()
	return err
}

func (p *Proxy) track(c net.Conn) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		c.Close()
		return false
	}
	p.conns[c] = struct{}{}
	return true
}

func (p *Proxy) untrack(c net.Conn) {
	p.mu.Lock()
	delete(p.conns, c)
	p.mu.Unlock()
	c.Close()
}

func (p *Proxy) accept() {
	defer p.wg.Done()
	for {
		client, err := p.ln.Accept()
		if err != nil {
			return
		}
		if !p.track(client) {
			continue
		}
		p.wg.Add(1)
		go func() {
			defer p.wg.Done()
			defer p.untrack(client)
			server, err := net.DialTimeout("tcp", p.target, 5*time.Second)
			if err != nil {
				return
			}
			if !p.track(server) {
				return
			}
			defer p.untrack(server)
			var wg sync.WaitGroup
			wg.Go(func() { p.pipe(Up, client, server) })
			wg.Go(func() { p.pipe(Down, server, client) })
			wg.Wait()
		}()
	}
}

type chunk struct {
	b   []byte
	due time.Time
}

// pipe copies src to dst in direction d: a reader queues chunks with their
// due time, a writer sends them when due and the direction is not stalled.
// When either side closes, both are closed.
func (p *Proxy) pipe(d Direction, src, dst net.Conn) {
	defer src.Close()
	defer dst.Close()
	queue := make(chan chunk, 1024)
	go func() {
		defer close(queue)
		for {
			buf := make([]byte, 32<<10)
			n, err := src.Read(buf)
			if n > 0 {
				if h := p.take(d, buf[:n]); h != nil {
					close(h.seen)
					select {
					case <-h.release:
					case <-p.quit:
						return
					}
				}
				p.mu.Lock()
				f := p.delay[d]
				p.mu.Unlock()
				due := time.Now()
				if f != nil {
					due = due.Add(f())
				}
				queue <- chunk{b: buf[:n], due: due}
			}
			if err != nil {
				return
			}
		}
	}()
	var last time.Time
	for c := range queue {
		if c.due.Before(last) {
			c.due = last // keep the order
		}
		last = c.due
		time.Sleep(time.Until(c.due))
		if !p.waitFlowing(d) {
			return
		}
		if _, err := dst.Write(c.b); err != nil {
			return
		}
	}
}

// waitFlowing blocks while direction d is stalled; false when the proxy
// closed.
func (p *Proxy) waitFlowing(d Direction) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	for p.stalled[d] && !p.closed {
		p.changed.Wait()
	}
	return !p.closed
}
