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

// TestInQueue checks inQueue against what it stands for,
// strings.HasPrefix(path, r.kindParent(key, kind)+"/"), on paths made
// for nearby keys and kinds, and that it allocates nothing.
func TestInQueue(t *testing.T) {
	r := mustNew(t, &zk.Conn{}, WithRoot("/a/root"))
	keys := []string{"k", "k/", "k%", "k%2F", "kk", ".", "..", "...", "%2E", "a/b", "a%2Fb", "é", "k%sem", "k%rw", ""}
	kinds := []backend.Kind{backend.KindMutex, backend.KindSemaphore, backend.KindRead, backend.KindWrite}
	var paths []string
	for _, k := range keys {
		for _, kind := range kinds {
			p := r.kindParent(k, kind)
			paths = append(paths, p, p+"/", p+"/_c_x-0000000001", p+"x/_c_x", strings.TrimSuffix(p, "m")+"/_c_x")
		}
	}
	paths = append(paths, "", "/", "/a", "/a/root", "/a/root/", "/a/rootk/_c_x", "/b/root/k/_c_x")
	for _, k := range keys {
		for _, kind := range kinds {
			for _, p := range paths {
				want := strings.HasPrefix(p, r.kindParent(k, kind)+"/")
				if got := r.inQueue(p, k, kind); got != want {
					t.Errorf("inQueue(%q, %q, %v) = %v; want %v", p, k, kind, got, want)
				}
			}
		}
	}
	p := r.kindParent("a/b", backend.KindRead) + "/_c_x-r-0000000001"
	if n := testing.AllocsPerRun(100, func() { r.inQueue(p, "a/b", backend.KindRead) }); n != 0 {
		t.Errorf("inQueue allocates %v times; want 0", n)
	}
}
