package zookeeper

import (
	"fmt"
	"strconv"
	"strings"
	"testing"

	"github.com/go-zookeeper/zk"

	"github.com/distlock/distlock/backend"
)

// decodeKey inverts encodeKey; it fails on a name encodeKey cannot produce.
func decodeKey(name string) (string, error) {
	b := make([]byte, 0, len(name))
	for i := 0; i < len(name); i++ {
		c := name[i]
		if c != '%' {
			if !keySafe(c) {
				return "", fmt.Errorf("unescaped byte %q at %d", c, i)
			}
			b = append(b, c)
			continue
		}
		if i+2 >= len(name) {
			return "", fmt.Errorf("short escape at %d", i)
		}
		v, err := strconv.ParseUint(name[i+1:i+3], 16, 8)
		if err != nil {
			return "", err
		}
		b = append(b, byte(v))
		i += 2
	}
	return string(b), nil
}

func TestEncodeKey(t *testing.T) {
	tests := []struct{ key, want string }{
		{"orders", "orders"},
		{"orders.2024-01:x@y", "orders.2024-01:x@y"},
		{"a/b", "a%2Fb"},
		{"50%", "50%25"},
		{".", "%2E"},
		{"..", "%2E."},
		{"...", "..."},
		{"zookeeper", "zookeeper"},
		{"sp ace", "sp%20ace"},
		{"\x00\xff", "%00%FF"},
		{"é", "%C3%A9"},
	}
	for _, tt := range tests {
		if got := encodeKey(tt.key); got != tt.want {
			t.Errorf("encodeKey(%q) = %q; want %q", tt.key, got, tt.want)
		}
	}
}

// FuzzEncodeKey proves the encoding injective (it decodes back, so two
// different keys never share a name) and every name legal.
func FuzzEncodeKey(f *testing.F) {
	for _, s := range []string{"", ".", "..", "a/b", "%2F", "%", "é", "\x00", "zookeeper", "a\u2028b"} {
		f.Add(s, s+".")
	}
	f.Fuzz(func(t *testing.T, a, b string) {
		if a == "" {
			return // the facade never passes an empty key
		}
		ea := encodeKey(a)
		if err := validName(ea); err != nil {
			t.Fatalf("encodeKey(%q) = %q: %v", a, ea, err)
		}
		if got, err := decodeKey(ea); err != nil || got != a {
			t.Fatalf("decodeKey(encodeKey(%q)) = %q, %v", a, got, err)
		}
		if a != b && b != "" && ea == encodeKey(b) {
			t.Fatalf("keys %q and %q share the name %q", a, b, ea)
		}
	})
}

// TestHeldPath: a held lock makes its znode's path again as the server
// named it (ZooKeeper writes the sequence number with %010d, signed), for
// keys that need escaping, every kind and sequence numbers across the
// counter's wrap; isPath knows it, and no nearby path; path allocates once
// and isPath never.
func TestHeldPath(t *testing.T) {
	r := mustNew(t, &zk.Conn{}, WithRoot("/a/root"))
	keys := []string{"k", "k/", "k%", "k%2F", ".", "..", "...", "a/b", "é", "k%sem", "k%rw"}
	kinds := []struct {
		kind  backend.Kind
		limit int32
	}{{backend.KindMutex, 0}, {backend.KindSemaphore, 1}, {backend.KindSemaphore, 2147483647}, {backend.KindRead, 0}, {backend.KindWrite, 0}}
	seqs := []int32{0, 1, 999999999, 1000000000, 2147483647, -2147483648, -1000000000, -999999999, -1}
	for _, k := range keys {
		for _, kl := range kinds {
			for _, seq := range seqs {
				h := &held{r: r, key: k, kind: kl.kind, limit: kl.limit, ctr: 0x1234abcd, seq: uint32(seq)}
				l := backend.Lease{Kind: kl.kind, Limit: kl.limit}
				var g [guidLen]byte
				want := r.kindParent(k, kl.kind) + "/" + guidPrefix + string(r.guidOf(&g, h.ctr)) + "-" + tagOf(&l) + "-" + fmt.Sprintf("%010d", seq)
				p := h.path()
				if p != want || len(p) != h.pathLen() {
					t.Fatalf("path of %q %v seq %d = %q (pathLen %d); want %q", k, kl.kind, seq, p, h.pathLen(), want)
				}
				if got, _, ok := sequence(p); !ok || got != uint32(seq) {
					t.Errorf("sequence(%q) = %d, %v; want %d", p, got, ok, seq)
				}
				if !h.isPath(p) {
					t.Errorf("isPath(%q) = false", p)
				}
				for _, other := range []string{p[:len(p)-1], p + "0", strings.Replace(p, "/a/root", "/a/rooT", 1), "", p[:len(p)-10] + "0000000002", p + "/x"} {
					if other != p && h.isPath(other) {
						t.Errorf("isPath(%q) = true for %q", other, p)
					}
				}
			}
		}
	}
	for _, other := range []struct {
		key   string
		kind  backend.Kind
		limit int32
		ctr   uint64
		seq   uint32
	}{{"k", backend.KindMutex, 0, 1, 2}, {"K", backend.KindMutex, 0, 1, 1}, {"k", backend.KindRead, 0, 1, 1}, {"k", backend.KindSemaphore, 1, 1, 1}, {"k", backend.KindSemaphore, 3, 1, 1}} {
		h := &held{r: r, key: "k", kind: backend.KindMutex, ctr: 1, seq: 1}
		o := &held{r: r, key: other.key, kind: other.kind, limit: other.limit, ctr: other.ctr, seq: other.seq}
		if h.isPath(o.path()) {
			t.Errorf("isPath(%q) = true for %q", o.path(), h.path())
		}
	}
	h := &held{r: r, key: "a/b", kind: backend.KindSemaphore, limit: 7, ctr: 99, seq: 12}
	p := h.path()
	if n := testing.AllocsPerRun(100, func() { h.isPath(p) }); n != 0 {
		t.Errorf("isPath allocates %v times; want 0", n)
	}
	if n := testing.AllocsPerRun(100, func() { _ = h.path() }); n != 1 {
		t.Errorf("path allocates %v times; want 1", n)
	}
}
