package etcd

import (
	"strings"
	"testing"
)

// FuzzEncodeKey checks that the queue directories of two different keys
// never overlap: encodeKey is injective (it decodes back) and makes one
// path segment (no '/'), so neither directory, nor any queue key in it, is
// under the other's. It also checks the growth MaxKeyLen's doc relies on
// (at most three bytes per key byte).
func FuzzEncodeKey(f *testing.F) {
	for _, s := range []string{"a", "a/", "/a", "a/b", "a%2Fb", "%", "%2F", "a\x00", ".", "..", "ключ", "\xff", "a b", "~"} {
		f.Add(s, s+"/x")
	}
	f.Add("a", "a%")
	f.Add("a/b", "a%2Fb")
	f.Fuzz(func(t *testing.T, a, b string) {
		if a == "" || b == "" {
			return // the facade never passes an empty key
		}
		ea := encodeKey(a)
		if strings.Contains(ea, "/") {
			t.Fatalf("encodeKey(%q) = %q has a '/'", a, ea)
		}
		if len(ea) > 3*len(a) {
			t.Fatalf("encodeKey(%q) is %d bytes; want at most %d", a, len(ea), 3*len(a))
		}
		if got, ok := decodeKey(ea); !ok || got != a {
			t.Fatalf("decodeKey(encodeKey(%q)) = %q, %v", a, got, ok)
		}
		// decodeKey takes only what encodeKey makes: b, as a segment,
		// decodes to a key whose encoding is b, or not at all.
		if got, ok := decodeKey(b); ok && encodeKey(got) != b {
			t.Fatalf("decodeKey(%q) = %q, whose encoding is %q", b, got, encodeKey(got))
		}
		if a == b {
			return
		}
		r := &Resource{prefix: DefaultPrefix}
		pa, pb := r.queuePrefix(a), r.queuePrefix(b)
		if pa == pb {
			t.Fatalf("keys %q and %q share the queue directory %q", a, b, pa)
		}
		// A queue key of b is pb + name, with name free of '/'.
		if strings.HasPrefix(pb+"name", pa) || strings.HasPrefix(pa+"name", pb) {
			t.Fatalf("queue directories %q (of %q) and %q (of %q) nest", pa, a, pb, b)
		}
	})
}
