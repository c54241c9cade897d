package proxy

import (
	"bufio"
	"bytes"
	"io"
	"net"
	"testing"
	"time"
)

func echoServer(t *testing.T) string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() { defer c.Close(); _, _ = io.Copy(c, c) }()
		}
	}()
	return ln.Addr().String()
}

func TestDelayAndStall(t *testing.T) {
	p, err := Start(echoServer(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	c, err := net.Dial("tcp", p.Addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	r := bufio.NewReader(c)
	roundTrip := func(msg string) (string, error) {
		if _, err := io.WriteString(c, msg+"\n"); err != nil {
			return "", err
		}
		return r.ReadString('\n')
	}
	if got, err := roundTrip("a"); err != nil || got != "a\n" {
		t.Fatalf("echo = %q, %v", got, err)
	}

	p.SetDelay(Down, func() time.Duration { return 50 * time.Millisecond })
	start := time.Now()
	if got, err := roundTrip("b"); err != nil || got != "b\n" {
		t.Fatalf("delayed echo = %q, %v", got, err)
	}
	if d := time.Since(start); d < 50*time.Millisecond {
		t.Errorf("delayed echo came back after %v; want >= 50ms", d)
	}
	p.SetDelay(Down, nil)

	p.Stall(Up)
	if _, err := io.WriteString(c, "c\n"); err != nil {
		t.Fatal(err)
	}
	_ = c.SetReadDeadline(time.Now().Add(100 * time.Millisecond))
	if got, err := r.ReadString('\n'); err == nil {
		t.Fatalf("stalled path answered %q", got)
	}
	_ = c.SetReadDeadline(time.Time{})
	p.Unstall(Up)
	if got, err := r.ReadString('\n'); err != nil || got != "c\n" {
		t.Fatalf("after Unstall = %q, %v; want the held bytes", got, err)
	}
}

// sinkServer accepts connections and sends every line it reads on the
// returned channel.
func sinkServer(t *testing.T) (string, <-chan string) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	lines := make(chan string, 16)
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				r := bufio.NewReader(c)
				for {
					line, err := r.ReadString('\n')
					if err != nil {
						return
					}
					lines <- line
				}
			}()
		}
	}()
	return ln.Addr().String(), lines
}

func TestHold(t *testing.T) {
	addr, lines := sinkServer(t)
	p, err := Start(addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	held := p.Hold(Up, func(b []byte) bool { return bytes.Contains(b, []byte("slow")) })

	slow, err := net.Dial("tcp", p.Addr)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := io.WriteString(slow, "slow\n"); err != nil {
		t.Fatal(err)
	}
	select {
	case <-held.Seen():
	case <-time.After(10 * time.Second):
		t.Fatal("the chunk to hold never came")
	}
	// Another connection flows meanwhile, with a chunk that would match
	// too: the Hold took one chunk.
	fast, err := net.Dial("tcp", p.Addr)
	if err != nil {
		t.Fatal(err)
	}
	defer fast.Close()
	if _, err := io.WriteString(fast, "fast, not slow\n"); err != nil {
		t.Fatal(err)
	}
	if got := <-lines; got != "fast, not slow\n" {
		t.Fatalf("first line through = %q; want the other connection's", got)
	}
	// The sender gives up before the chunk is let go: it arrives anyway.
	slow.Close()
	held.Release()
	held.Release() // harmless
	select {
	case got := <-lines:
		if got != "slow\n" {
			t.Fatalf("released line = %q; want %q", got, "slow\n")
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the released chunk never arrived")
	}
}

// TestHoldUntilClose: a chunk still held when the proxy closes is
// dropped, and Close does not wait for its release.
func TestHoldUntilClose(t *testing.T) {
	addr, lines := sinkServer(t)
	p, err := Start(addr)
	if err != nil {
		t.Fatal(err)
	}
	held := p.Hold(Up, func([]byte) bool { return true })
	c, err := net.Dial("tcp", p.Addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, err := io.WriteString(c, "held\n"); err != nil {
		t.Fatal(err)
	}
	<-held.Seen()
	if err := p.Close(); err != nil {
		t.Fatalf("Close = %v", err)
	}
	held.Release()
	select {
	case got := <-lines:
		t.Fatalf("the server got %q after the proxy closed", got)
	default:
	}
}
