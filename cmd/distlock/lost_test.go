//go:build unix

package main

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/distlock/distlock/internal/testserver"
)

// TestLostWhenStoreFrozen freezes Redis (SIGSTOP) while distlock holds a
// key, past its TTL: the command gets SIGTERM before the store could have
// freed the key (by the server's own record of when it last set the key's
// expiry), SIGKILL after --grace since it ignores SIGTERM, its process
// group goes with it, and distlock exits with 79. Once Redis answers
// again the key is free.
func TestLostWhenStoreFrozen(t *testing.T) {
	srv := testserver.Redis(t)
	url := "redis://" + srv.Addr
	key := uniqueKey(t)
	const ttl = 3 * time.Second
	mon := monitor(t, srv.Addr)
	file := filepath.Join(t.TempDir(), "child")
	p := start(t, nil, append([]string{"run", "--store", url, "-v", "--ttl", ttl.String(), "--grace", "1s", key},
		childCmd("-file", file, "-hold", "1h", "-signals", "-grandchild")...)...)
	child := waitRecord(t, file, "start")
	grandchild := waitRecord(t, file, "grandchild")
	t.Cleanup(func() { // if the test failed before distlock killed it
		if alive(grandchild.pid) {
			syscall.Kill(grandchild.pid, syscall.SIGKILL)
		}
	})

	srv.Pause()
	frozen := time.Now()
	resumed := false
	defer func() {
		if !resumed {
			srv.Resume()
		}
	}()
	term := waitRecord(t, file, "signal")
	waitGone(t, child.pid, "the command (it ignores SIGTERM: SIGKILL after --grace)")
	waitGone(t, grandchild.pid, "a process the command started in its group")
	srv.Resume()
	resumed = true
	if code := p.wait(); code != exitLost {
		t.Errorf("status %d; want %d; stderr:\n%s", code, exitLost, p.errText())
	}
	if term.name != "TERM" {
		t.Errorf("the command got %s first; want TERM", term.name)
	}
	for _, want := range []string{"lost " + strconv.Quote(key), "SIGKILL"} {
		if !strings.Contains(p.errText(), want) {
			t.Errorf("stderr does not say %q:\n%s", want, p.errText())
		}
	}

	// When could Redis have freed the key? At the latest expiry set on it
	// before the freeze: the acquire script's SET ... PX or a renewal's
	// PEXPIRE, by the server's clock (the machine's: the child's too).
	expiry := mon.expiry(t, "distlock:{"+key+"}", frozen)
	if expiry.IsZero() {
		t.Fatalf("MONITOR showed no expiry set on the key before the freeze")
	}
	if got := time.Unix(0, term.at); !got.Before(expiry) {
		t.Errorf("the command got SIGTERM at %v, %v after the store could have freed the key (%v)",
			got.Format(time.StampMicro), got.Sub(expiry), expiry.Format(time.StampMicro))
	} else {
		t.Logf("the command got SIGTERM %v before the store could have freed the key, %v after the freeze",
			expiry.Sub(got).Round(time.Millisecond), got.Sub(frozen).Round(time.Millisecond))
	}

	if code, stderr := runDistlock(t, nil, "run", "--store", url, "--wait", (2 * ttl).String(), key, "--", "true"); code != 0 {
		t.Errorf("after the store came back: status %d; want 0 (the key free); stderr:\n%s", code, stderr)
	}
}

// redisMonitor reads a Redis server's MONITOR feed.
type redisMonitor struct {
	addr  string
	mu    sync.Mutex
	lines []string
	seen  map[string]chan struct{} // ECHO markers waited for
}

// monitor starts reading addr's MONITOR feed until the test ends.
func monitor(t *testing.T, addr string) *redisMonitor {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	r := bufio.NewReader(c)
	if _, err := c.Write([]byte("MONITOR\r\n")); err != nil {
		t.Fatal(err)
	}
	if l, err := r.ReadString('\n'); err != nil || !strings.HasPrefix(l, "+OK") {
		t.Fatalf("MONITOR: %q, %v", l, err)
	}
	m := &redisMonitor{addr: addr, seen: make(map[string]chan struct{})}
	go func() {
		for {
			l, err := r.ReadString('\n')
			if err != nil {
				return
			}
			m.mu.Lock()
			m.lines = append(m.lines, strings.TrimRight(l, "\r\n"))
			for marker, ch := range m.seen {
				if strings.Contains(l, marker) {
					close(ch)
					delete(m.seen, marker)
				}
			}
			m.mu.Unlock()
		}
	}()
	return m
}

// sync returns once the feed has shown every command the server ran
// before now: it sends an ECHO and waits for it in the feed.
func (m *redisMonitor) sync(t *testing.T) {
	t.Helper()
	marker := fmt.Sprintf("sync-%d", time.Now().UnixNano())
	ch := make(chan struct{})
	m.mu.Lock()
	m.seen[marker] = ch
	m.mu.Unlock()
	c := goredis.NewClient(&goredis.Options{Addr: m.addr})
	defer c.Close()
	if err := c.Echo(context.Background(), marker).Err(); err != nil {
		t.Fatal(err)
	}
	select {
	case <-ch:
	case <-time.After(patience):
		t.Fatalf("MONITOR did not show the ECHO within %v", patience)
	}
}

// expiry returns the latest expiry set on key by a command the server ran
// before the time before: SET key ... PX ms, or PEXPIRE key ms (those the
// lock scripts run).
func (m *redisMonitor) expiry(t *testing.T, key string, before time.Time) time.Time {
	t.Helper()
	m.sync(t)
	m.mu.Lock()
	defer m.mu.Unlock()
	var latest time.Time
	for _, l := range m.lines {
		// +1700000000.123456 [0 lua] "SET" "distlock:{k}" "v" "NX" "PX" "3000"
		stamp, rest, ok := strings.Cut(strings.TrimPrefix(l, "+"), " ")
		if !ok {
			continue
		}
		sec, usec, _ := strings.Cut(stamp, ".")
		s, err1 := strconv.ParseInt(sec, 10, 64)
		us, err2 := strconv.ParseInt(usec, 10, 64)
		if err1 != nil || err2 != nil {
			continue
		}
		at := time.Unix(s, us*1000)
		if !at.Before(before) {
			continue
		}
		_, rest, _ = strings.Cut(rest, "] ")
		args := quotedArgs(rest)
		var ms string
		switch {
		case len(args) == 3 && strings.EqualFold(args[0], "PEXPIRE") && args[1] == key:
			ms = args[2]
		case len(args) >= 3 && strings.EqualFold(args[0], "SET") && args[1] == key:
			for i := 3; i+1 < len(args); i++ {
				if strings.EqualFold(args[i], "PX") {
					ms = args[i+1]
				}
			}
		}
		if n, err := strconv.ParseInt(ms, 10, 64); err == nil {
			if e := at.Add(time.Duration(n) * time.Millisecond); e.After(latest) {
				latest = e
			}
		}
	}
	return latest
}

// quotedArgs splits MONITOR's "a" "b" "c" into its arguments.
func quotedArgs(s string) []string {
	var args []string
	for s = strings.TrimSpace(s); s != ""; s = strings.TrimSpace(s) {
		q, err := strconv.QuotedPrefix(s)
		if err != nil {
			return args
		}
		a, err := strconv.Unquote(q)
		if err != nil {
			return args
		}
		args = append(args, a)
		s = s[len(q):]
	}
	return args
}
