package owner

import "testing"

func TestNewUniqueHex(t *testing.T) {
	seen := make(map[string]bool)
	for range 10000 {
		v := New()
		if len(v) != 32 {
			t.Fatalf("len(%q) = %d; want 32", v, len(v))
		}
		for _, c := range v {
			if !('0' <= c && c <= '9' || 'a' <= c && c <= 'f') {
				t.Fatalf("%q has non-hex %q", v, c)
			}
		}
		if seen[v] {
			t.Fatalf("duplicate value %q", v)
		}
		seen[v] = true
	}
}

func BenchmarkNew(b *testing.B) {
	b.ReportAllocs()
	for b.Loop() {
		_ = New()
	}
}
