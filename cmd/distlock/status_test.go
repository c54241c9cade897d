//go:build unix

package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
)

// statusOf runs distlock status with flags and --json on key, and returns
// its exit status and what it printed, parsed; a status other than 0 or 1
// fails the test.
func statusOf(t *testing.T, url, key string, flags ...string) (int, statusJSON) {
	t.Helper()
	p := start(t, nil, append(append([]string{"status", "--store", url, "--json"}, flags...), key)...)
	code := p.wait()
	p.mu.Lock()
	out := p.stdout.String()
	p.mu.Unlock()
	var st statusJSON
	if code != 0 && code != exitFree {
		t.Fatalf("distlock status %q: status %d; want 0 or %d; stderr:\n%s", flags, code, exitFree, p.errText())
	}
	if err := json.Unmarshal([]byte(out), &st); err != nil {
		t.Fatalf("distlock status %q --json: %v; output:\n%s", flags, err, out)
	}
	if st.Key != key || st.Held != (len(st.Holders) > 0) || st.Holders == nil {
		t.Errorf("distlock status %q --json: %s; want key %q and held as there are holders ([] when free)", flags, out, key)
	}
	if (code == 0) != st.Held {
		t.Errorf("distlock status %q: status %d with held %v; want 0 when held, %d when free", flags, code, st.Held, exitFree)
	}
	return code, st
}

// statusText runs distlock status without --json and returns its exit
// status and output.
func statusText(t *testing.T, url, key string, flags ...string) (int, string) {
	t.Helper()
	p := start(t, nil, append(append([]string{"status", "--store", url}, flags...), key)...)
	code := p.wait()
	p.mu.Lock()
	defer p.mu.Unlock()
	return code, p.stdout.String() + p.stderr.String()
}

// labelOf is the label distlock with pid gives its grants.
func labelOf(t *testing.T, pid int) string {
	t.Helper()
	host, err := os.Hostname()
	if err != nil {
		t.Fatal(err)
	}
	return host + ":" + strconv.Itoa(pid)
}

// checkHolders checks status's holders against the start records of the
// commands that hold the lock: one holder each, labelled with its
// distlock's HOST:PID, with its token, kind and a time left within the
// TTL (10s by default), or none on ZooKeeper.
func checkHolders(t *testing.T, k storeKind, st statusJSON, kind string, running []record) {
	t.Helper()
	var got, want []string
	for _, h := range st.Holders {
		got = append(got, h.Label+" "+h.Kind+" "+strconv.FormatUint(h.Token, 10))
		if h.TTLms == nil && k.name == "zookeeper" {
			// The session keeps a renewed lock alive: no time left
			// to tell (the zookeeper package doc), so null.
		} else if h.TTLms == nil || *h.TTLms <= 0 || *h.TTLms > defaultTTL.Milliseconds() {
			t.Errorf("holder %s: time left %v ms; want within the TTL, %v", h.Label, h.TTLms, defaultTTL)
		}
	}
	for _, r := range running {
		token := r.token
		if !k.tokens {
			token = 0
		}
		want = append(want, labelOf(t, r.ppid)+" "+kind+" "+strconv.FormatUint(token, 10))
	}
	slices.Sort(got)
	slices.Sort(want)
	if !slices.Equal(got, want) {
		t.Errorf("status shows holders %q; want %q", got, want)
	}
}

// testStatus: distlock status of a key's mutex: free (exit 1), held by a
// run (exit 0, its label, token and time left), free again once the run
// ended. On a store that cannot inspect, exit 2 saying so.
func testStatus(t *testing.T, k storeKind, url string) {
	key := uniqueKey(t)
	if k.noInspect != "" {
		code, out := statusText(t, url, key)
		if code != exitUsage || !strings.Contains(out, "cannot tell who holds a lock") {
			t.Errorf("status on a store without inspection: status %d, output:\n%s\nwant %d and why", code, out, exitUsage)
		}
		return
	}
	if code, st := statusOf(t, url, key); code != exitFree || st.Kind != "mutex" {
		t.Errorf("status of a free key: status %d, kind %q; want %d, mutex", code, st.Kind, exitFree)
	}
	if code, out := statusText(t, url, key); code != exitFree || out != strconv.Quote(key)+" (mutex): free\n" {
		t.Errorf("status of a free key: status %d, output %q", code, out)
	}
	file := filepath.Join(t.TempDir(), "held")
	holder := start(t, nil, append([]string{"run", "--store", url, key}, childCmd("-file", file, "-hold", "stdin")...)...)
	child := waitRecord(t, file, "start")
	code, st := statusOf(t, url, key)
	if code != 0 {
		t.Errorf("status of a held key: %d; want 0", code)
	}
	checkHolders(t, k, st, "mutex", []record{child})
	code, out := statusText(t, url, key)
	if code != 0 || !strings.HasPrefix(out, strconv.Quote(key)+" (mutex): held\n") || !strings.Contains(out, labelOf(t, child.ppid)) {
		t.Errorf("status of a held key: status %d, output:\n%s\nwant 0, held and the holder's label", code, out)
	}
	if code := holder.wait(); code != 0 {
		t.Errorf("holder: status %d; want 0; stderr:\n%s", code, holder.errText())
	}
	if code, _ := statusOf(t, url, key); code != exitFree {
		t.Errorf("status after the holder ended: %d; want %d", code, exitFree)
	}
}
