package resource

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"sync"
	"time"

	"github.com/distlock/distlock/safety/history"
)

// request and response are the wire format: one JSON object per line.
type request struct {
	Op    string `json:"op"` // "write", "get", "set"
	Owner string `json:"owner,omitempty"`
	Token uint64 `json:"token,omitempty"`
	Read  int64  `json:"read,omitempty"`
	Value int64  `json:"value,omitempty"`
}

type response struct {
	Accepted bool   `json:"accepted,omitempty"`
	Seq      int64  `json:"seq,omitempty"`
	Value    int64  `json:"value,omitempty"`
	Err      string `json:"err,omitempty"`
}

// Server is the protected resource.
type Server struct {
	ln  net.Listener
	rec *history.Recorder

	mu        sync.Mutex
	seq       int64
	last      uint64 // token of the last accepted write
	lastOwner string
	counter   int64
	accepted  int64
	refused   int64
	conns     map[net.Conn]struct{}
	wg        sync.WaitGroup
}

// Listen starts a server on the Unix socket path, recording into rec.
func Listen(path string, rec *history.Recorder) (*Server, error) {
	ln, err := net.Listen("unix", path)
	if err != nil {
		return nil, fmt.Errorf("resource: %w", err)
	}
	s := &Server{ln: ln, rec: rec, conns: map[net.Conn]struct{}{}}
	s.wg.Add(1)
	go s.accept()
	return s, nil
}

func (s *Server) accept() {
	defer s.wg.Done()
	for {
		c, err := s.ln.Accept()
		if err != nil {
			return
		}
		s.mu.Lock()
		s.conns[c] = struct{}{}
		s.mu.Unlock()
		s.wg.Add(1)
		go s.serve(c)
	}
}

func (s *Server) serve(c net.Conn) {
	defer s.wg.Done()
	defer func() {
		s.mu.Lock()
		delete(s.conns, c)
		s.mu.Unlock()
		c.Close()
	}()
	sc := bufio.NewScanner(c)
	enc := json.NewEncoder(c)
	for sc.Scan() {
		var req request
		var resp response
		if err := json.Unmarshal(sc.Bytes(), &req); err != nil {
			resp.Err = err.Error()
		} else {
			resp = s.handle(req)
		}
		if err := enc.Encode(resp); err != nil {
			return
		}
	}
}

func (s *Server) handle(req request) response {
	s.mu.Lock()
	defer s.mu.Unlock()
	switch req.Op {
	case "write":
		s.seq++
		ok := req.Token > s.last || (req.Token == s.last && req.Owner == s.lastOwner)
		if ok {
			s.last, s.lastOwner = req.Token, req.Owner
			s.accepted++
		} else {
			s.refused++
		}
		s.record(history.Event{Kind: history.StoreWrite, Owner: req.Owner, Token: req.Token, Accepted: ok, Seq: s.seq})
		return response{Accepted: ok, Seq: s.seq}
	case "get":
		return response{Value: s.counter}
	case "set":
		s.seq++
		s.counter = req.Value
		s.record(history.Event{Kind: history.StoreIncr, Owner: req.Owner, Read: req.Read, Wrote: req.Value, Seq: s.seq})
		return response{Seq: s.seq}
	}
	return response{Err: fmt.Sprintf("unknown op %q", req.Op)}
}

func (s *Server) record(e history.Event) {
	e.At = history.Now()
	if s.rec != nil {
		_ = s.rec.Add(e) // the history file is the test's own temp dir
	}
}

// Stats returns how many writes were accepted and refused, and the counter.
func (s *Server) Stats() (accepted, refused, counter int64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.accepted, s.refused, s.counter
}

// Close stops the server and waits for its connections to end.
func (s *Server) Close() error {
	err := s.ln.Close()
	s.mu.Lock()
	for c := range s.conns {
		c.Close()
	}
	s.mu.Unlock()
	s.wg.Wait()
	return err
}

// Client is one worker's connection. It is not safe for concurrent use.
type Client struct {
	c   net.Conn
	sc  *bufio.Scanner
	enc *json.Encoder
}

// Dial connects to the server at the Unix socket path.
func Dial(path string) (*Client, error) {
	c, err := net.Dial("unix", path)
	if err != nil {
		return nil, fmt.Errorf("resource: %w", err)
	}
	return &Client{c: c, sc: bufio.NewScanner(c), enc: json.NewEncoder(c)}, nil
}

func (c *Client) do(ctx context.Context, req request) (response, error) {
	deadline, ok := ctx.Deadline()
	if !ok {
		deadline = time.Now().Add(10 * time.Second)
	}
	if err := c.c.SetDeadline(deadline); err != nil {
		return response{}, err
	}
	if err := c.enc.Encode(req); err != nil {
		return response{}, fmt.Errorf("resource: %s: %w", req.Op, err)
	}
	if !c.sc.Scan() {
		err := c.sc.Err()
		if err == nil {
			err = errors.New("connection closed")
		}
		return response{}, fmt.Errorf("resource: %s: %w", req.Op, err)
	}
	var resp response
	if err := json.Unmarshal(c.sc.Bytes(), &resp); err != nil {
		return response{}, fmt.Errorf("resource: %s: %w", req.Op, err)
	}
	if resp.Err != "" {
		return resp, fmt.Errorf("resource: %s: %s", req.Op, resp.Err)
	}
	return resp, nil
}

// Write asks the fenced register to accept a write by owner with token.
// It returns the store's verdict and sequence number.
func (c *Client) Write(ctx context.Context, owner string, token uint64) (accepted bool, seq int64, err error) {
	resp, err := c.do(ctx, request{Op: "write", Owner: owner, Token: token})
	return resp.Accepted, resp.Seq, err
}

// Get reads the counter.
func (c *Client) Get(ctx context.Context) (int64, error) {
	resp, err := c.do(ctx, request{Op: "get"})
	return resp.Value, err
}

// Set writes the counter: owner had read read and writes value.
func (c *Client) Set(ctx context.Context, owner string, read, value int64) error {
	_, err := c.do(ctx, request{Op: "set", Owner: owner, Read: read, Value: value})
	return err
}

// Close closes the connection.
func (c *Client) Close() error { return c.c.Close() }
