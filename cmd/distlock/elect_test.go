//go:build unix

package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// leaderOf runs `distlock status --elect --json NAME` and returns its exit
// status and output.
func leaderOf(t *testing.T, url, name string) (int, leaderJSON) {
	t.Helper()
	p := start(t, nil, "status", "--store", url, "--elect", "--json", name)
	code := p.wait()
	p.mu.Lock()
	out := p.stdout.String()
	p.mu.Unlock()
	if code != 0 && code != exitFree {
		t.Fatalf("distlock status --elect: status %d; want 0 or %d; stderr:\n%s", code, exitFree, p.errText())
	}
	var l leaderJSON
	if err := json.Unmarshal([]byte(out), &l); err != nil {
		t.Fatalf("distlock status --elect --json: %v; output:\n%s", err, out)
	}
	if l.Election != name || (code == 0) != l.Led {
		t.Errorf("distlock status --elect --json: status %d, %s; want election %q, led when 0", code, out, name)
	}
	return code, l
}

// TestElect runs `distlock run --elect` on every store, against a real
// server each: two runs of one election, the second waiting while the
// first leads; each command gets the election and its term in its
// environment, terms grow; status --elect shows the leader, its value and
// term while one leads, and exits 1 when none does.
func TestElect(t *testing.T) {
	for _, k := range storeKinds {
		t.Run(k.name, func(t *testing.T) {
			url := k.url(t)
			name := uniqueKey(t)
			file := filepath.Join(t.TempDir(), "terms")
			if code, _ := leaderOf(t, url, name); code != exitFree {
				t.Errorf("status --elect before any run: %d; want %d", code, exitFree)
			}
			// The command notes its environment, then holds until its
			// stdin (distlock's) closes.
			cmd := []string{"--", "sh", "-c", `echo "$DISTLOCK_ELECTION $DISTLOCK_TERM $DISTLOCK_TOKEN $DISTLOCK_KEY" >> "$0"; cat >/dev/null`, file}
			run := func(value string) *proc {
				return start(t, nil, append([]string{"run", "--store", url, "-v", "--elect", "--value", value, "--ttl", "5s", name}, cmd...)...)
			}
			lines := func(n int) []string {
				t.Helper()
				deadline := time.Now().Add(patience)
				for {
					b, _ := os.ReadFile(file)
					ls := strings.Split(strings.TrimSpace(string(b)), "\n")
					if len(b) == 0 {
						ls = nil
					}
					if len(ls) > n {
						t.Fatalf("%d leaders' commands ran; want %d: %q", len(ls), n, ls)
					}
					if len(ls) == n {
						return ls
					}
					if time.Now().After(deadline) {
						t.Fatalf("%d commands ran within %v; want %d", len(ls), patience, n)
					}
					time.Sleep(10 * time.Millisecond)
				}
			}
			term := func(line string) uint64 {
				t.Helper()
				f := strings.Fields(line) // election term token key
				if len(f) != 4 || f[0] != name || f[3] != name || f[1] != f[2] {
					t.Fatalf("the command's environment: %q; want %q, a term equal to the token, and the key", line, name)
				}
				n, err := strconv.ParseUint(f[1], 10, 64)
				if err != nil {
					t.Fatal(err)
				}
				return n
			}
			a := run("http://a:8080")
			first := term(lines(1)[0])
			code, l := leaderOf(t, url, name)
			if code != 0 || l.Value != "http://a:8080" || !strings.HasSuffix(l.Label, ":"+strconv.Itoa(a.cmd.Process.Pid)) || (k.tokens && l.Term != first) {
				t.Errorf("status --elect while a leads: %d, %+v; want value http://a:8080, a's label, term %d", code, l, first)
			}
			if code, out := runStatusText(t, url, name); code != 0 || !strings.Contains(out, `led by `) || !strings.Contains(out, `value "http://a:8080"`) {
				t.Errorf("status --elect (text) while a leads: %d:\n%s", code, out)
			}
			b := run("http://b:8080")
			b.waitLine("waiting for the leadership") // b campaigns behind a
			if code, l := leaderOf(t, url, name); code != 0 || l.Value != "http://a:8080" {
				t.Errorf("status --elect with b campaigning: %d, %+v; want a still leading", code, l)
			}
			lines(1) // b's command has not run
			if code := a.wait(); code != 0 {
				t.Fatalf("a: status %d; want 0 (its command's); stderr:\n%s", code, a.errText())
			}
			second := term(lines(2)[1])
			if k.tokens && second <= first {
				t.Errorf("term %d after term %d; want larger", second, first)
			}
			if code := b.wait(); code != 0 {
				t.Fatalf("b: status %d; want 0; stderr:\n%s", code, b.errText())
			}
			if code, l := leaderOf(t, url, name); code != exitFree || l.Led {
				t.Errorf("status --elect after both ran: %d, %+v; want %d, no leader", code, l, exitFree)
			}
		})
	}
}

// runStatusText runs `distlock status --elect NAME` and returns its exit
// status and output.
func runStatusText(t *testing.T, url, name string) (int, string) {
	t.Helper()
	return statusText(t, url, name, "--elect")
}

// TestElectHoldUntilSignal: --elect without a COMMAND leads until a
// signal, as etcdctl elect does: it prints the environment, election and
// term included, on stdout once elected, status --elect shows it leading,
// and on SIGTERM it resigns and exits 0. On Redis.
func TestElectHoldUntilSignal(t *testing.T) {
	url := storeKinds[0].url(t)
	name := uniqueKey(t)
	p := start(t, nil, "run", "--store", url, "--elect", "--value", "v1", name)
	deadline := time.Now().Add(patience)
	var out string
	for !strings.Contains(out, "DISTLOCK_TERM=") {
		if time.Now().After(deadline) {
			t.Fatalf("no DISTLOCK_TERM on stdout within %v; stderr:\n%s", patience, p.errText())
		}
		time.Sleep(10 * time.Millisecond) // polling what distlock prints, with a deadline
		p.mu.Lock()
		out = p.stdout.String()
		p.mu.Unlock()
	}
	env := map[string]string{}
	for _, l := range strings.Split(strings.TrimSpace(out), "\n") {
		k, v, _ := strings.Cut(l, "=")
		env[k] = v
	}
	if env["DISTLOCK_KEY"] != name || env["DISTLOCK_ELECTION"] != name || env["DISTLOCK_TERM"] == "" || env["DISTLOCK_TERM"] != env["DISTLOCK_TOKEN"] {
		t.Errorf("stdout %q; want DISTLOCK_KEY and DISTLOCK_ELECTION %s, DISTLOCK_TERM the token", out, name)
	}
	if code, l := leaderOf(t, url, name); code != 0 || l.Value != "v1" || strconv.FormatUint(l.Term, 10) != env["DISTLOCK_TERM"] {
		t.Errorf("status --elect while it leads: %d, %+v; want value v1, term %s", code, l, env["DISTLOCK_TERM"])
	}
	if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if code := p.wait(); code != 0 {
		t.Errorf("after SIGTERM: status %d; want 0; stderr:\n%s", code, p.errText())
	}
	if code, _ := leaderOf(t, url, name); code != exitFree {
		t.Errorf("status --elect after it resigned: %d; want %d", code, exitFree)
	}
}
