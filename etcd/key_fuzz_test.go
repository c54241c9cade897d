package etcd

import (
	"fmt"
	"strconv"
	"strings"
	"testing"
)

// decodeKey inverts encodeKey; it fails on a segment encodeKey cannot
// produce (a reserved byte left as is, lower-case hex, an escaped
// unreserved byte).
func decodeKey(seg string) (string, error) {
	b := make([]byte, 0, len(seg))
	for i := 0; i < len(seg); i++ {
		c := seg[i]
		if c != '%' {
			if !unreserved(c) {
				return "", fmt.Errorf("unescaped byte %q at %d", c, i)
			}
			b = append(b, c)
			continue
		}
		if i+2 >= len(seg) {
			return "", fmt.Errorf("short escape at %d", i)
		}
		hex := seg[i+1 : i+3]
		if strings.ToUpper(hex) != hex {
			return "", fmt.Errorf("lower-case escape %q at %d", hex, i)
		}
		v, err := strconv.ParseUint(hex, 16, 8)
		if err != nil {
			return "", err
		}
		if unreserved(byte(v)) {
			return "", fmt.Errorf("escaped unreserved byte %q at %d", byte(v), i)
		}
		b = append(b, byte(v))
		i += 2
	}
	return string(b), nil
}

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
		if got, err := decodeKey(ea); err != nil || got != a {
			t.Fatalf("decodeKey(encodeKey(%q)) = %q, %v", a, got, err)
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
