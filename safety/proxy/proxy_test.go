package proxy

import (
	"bufio"
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
