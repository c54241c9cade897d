package redisscript

import (
	"strings"
	"testing"
	"time"
)

func TestEscapeTag(t *testing.T) {
	for _, tc := range []struct{ in, want string }{
		{"plain", "plain"},
		{"a{b}c", "a%7Bb%7Dc"},
		{"%", "%25"},
		{"%7B", "%257B"},
		{"{", "%7B"},
		{"}}", "%7D%7D"},
		{"", ""},
	} {
		got := EscapeTag(tc.in)
		if got != tc.want {
			t.Errorf("EscapeTag(%q) = %q; want %q", tc.in, got, tc.want)
		}
		back, ok := UnescapeTag(got)
		if !ok || back != tc.in {
			t.Errorf("UnescapeTag(%q) = %q, %v; want %q, true", got, back, ok, tc.in)
		}
	}
}

func TestUnescapeTagRejects(t *testing.T) {
	for _, s := range []string{"{", "a}", "%", "%7", "%7b", "%41", "%2"} {
		if k, ok := UnescapeTag(s); ok {
			t.Errorf("UnescapeTag(%q) = %q, true; want false", s, k)
		}
	}
}

func TestLayout(t *testing.T) {
	for _, tc := range []struct{ prefix, key, lock string }{
		{"distlock:", "k", "distlock:{k}"},
		{"distlock:", "a{b}", "distlock:{a%7Bb%7D}"},
		{"distlock:", "k:fence", "distlock:{k:fence}"},
		{"", "}", "{%7D}"},
		{"p{x}", "k", "p%7Bx%7D{k}"},
		{"{}", "0", "%7B%7D{0}"},
	} {
		lock, fence := Layout(tc.prefix, tc.key)
		if lock != tc.lock || fence != tc.lock+FenceSuffix {
			t.Errorf("Layout(%q, %q) = %q, %q; want %q, %q", tc.prefix, tc.key, lock, fence, tc.lock, tc.lock+FenceSuffix)
		}
		if hashSlot(lock) != hashSlot(fence) {
			t.Errorf("Layout(%q, %q): slots %d and %d differ", tc.prefix, tc.key, hashSlot(lock), hashSlot(fence))
		}
	}
	// A key and the same key with ":fence" appended never collide.
	_, f1 := Layout("p:", "k")
	l2, _ := Layout("p:", "k:fence")
	if f1 == l2 {
		t.Errorf("fence of k and lock of k:fence are both %q", f1)
	}
}

func TestLayoutAllocs(t *testing.T) {
	n := testing.AllocsPerRun(100, func() { Layout("distlock:", "some-key") })
	if n != 1 {
		t.Errorf("Layout allocs = %v; want 1", n)
	}
}

func TestMillis(t *testing.T) {
	for _, tc := range []struct {
		in   time.Duration
		want int64
	}{
		{time.Nanosecond, 1},
		{time.Millisecond, 1},
		{1200 * time.Microsecond, 2},
		{time.Second, 1000},
		{time.Second + 1, 1001},
	} {
		if got := Millis(tc.in); got != tc.want {
			t.Errorf("Millis(%v) = %d; want %d", tc.in, got, tc.want)
		}
	}
}

func TestDecodeAcquire(t *testing.T) {
	for _, tc := range []struct {
		v     int64
		ok    bool
		token uint64
		ttl   time.Duration
	}{
		{7, true, 7, 0},
		{0, false, 0, 0},
		{-250, false, 0, 250 * time.Millisecond},
	} {
		ok, token, ttl := DecodeAcquire(tc.v)
		if ok != tc.ok || token != tc.token || ttl != tc.ttl {
			t.Errorf("DecodeAcquire(%d) = %v, %d, %v; want %v, %d, %v", tc.v, ok, token, ttl, tc.ok, tc.token, tc.ttl)
		}
	}
}

// FuzzLayout checks that the escaping is injective and brace-free and that
// a lock and its fence always share a Cluster hash slot.
func FuzzLayout(f *testing.F) {
	for _, s := range []string{"k", "{", "}", "%", "a{b}c", "%7B", "{}", "x:fence"} {
		f.Add("distlock:", s)
	}
	f.Add("p{", "k")
	f.Add("}{", "}")
	f.Fuzz(func(t *testing.T, prefix, key string) {
		if key == "" {
			return
		}
		e := EscapeTag(key)
		if strings.ContainsAny(e, "{}") {
			t.Fatalf("EscapeTag(%q) = %q has a brace", key, e)
		}
		if back, ok := UnescapeTag(e); !ok || back != key {
			t.Fatalf("UnescapeTag(EscapeTag(%q)) = %q, %v", key, back, ok)
		}
		lock, fence := Layout(prefix, key)
		if lock != EscapeTag(prefix)+"{"+e+"}" || fence != lock+FenceSuffix {
			t.Fatalf("Layout(%q, %q) = %q, %q", prefix, key, lock, fence)
		}
		if hashSlot(lock) != hashSlot(fence) || hashSlot(lock) != crc16(e)%16384 {
			t.Fatalf("Layout(%q, %q): slots %d, %d; want both %d (tag %q)",
				prefix, key, hashSlot(lock), hashSlot(fence), crc16(e)%16384, e)
		}
		// Every key of every kind of lock on key, fences included, shares
		// the slot; none is a tombstone's name (those alone have
		// DeadInfix right after the tag).
		names := append(StateKeys(prefix, key), fence, lock+SemFenceSuffix, lock+RWFenceSuffix)
		names = append(names, SemaphoreKeys(lock)...)
		names = append(names, RWKeys(lock)...)
		for _, n := range names {
			if hashSlot(n) != hashSlot(lock) {
				t.Fatalf("key %q of lock %q: slot %d; want %d", n, lock, hashSlot(n), hashSlot(lock))
			}
			if strings.HasPrefix(n[strings.IndexByte(n, '}')+1:], DeadInfix) {
				t.Fatalf("key %q of lock %q looks like a tombstone", n, lock)
			}
		}
		// A tombstone (any value: try the key and the prefix) shares the
		// slot and is no lock or fence name: those end with the tag's '}'
		// or with FenceSuffix right after it.
		for _, v := range []string{key, prefix, ""} {
			dead := DeadKey(lock, v)
			if hashSlot(dead) != hashSlot(lock) {
				t.Fatalf("DeadKey(%q, %q) = %q: slot %d; want %d", lock, v, dead, hashSlot(dead), hashSlot(lock))
			}
			tail := dead[strings.IndexByte(dead, '}')+1:]
			if tail == "" || tail == FenceSuffix {
				t.Fatalf("DeadKey(%q, %q) = %q looks like a lock or fence name", lock, v, dead)
			}
		}
	})
}

// hashSlot is Slot, under the name the tests use.
func hashSlot(key string) uint16 { return Slot(key) }

func TestCRC16(t *testing.T) {
	// From the Redis Cluster specification.
	if got := crc16("123456789"); got != 0x31C3 {
		t.Errorf("crc16(123456789) = %#x; want 0x31c3", got)
	}
}

func TestSlot(t *testing.T) {
	// CLUSTER KEYSLOT answers.
	for _, tc := range []struct {
		key  string
		want uint16
	}{
		{"foo", 12182},
		{"{foo}bar", 12182},
		{"x{foo}y{z}", 12182},
		{"somekey", 11058},
		{"{}foo", Slot("{}foo")}, // an empty tag: the whole key
	} {
		if got := Slot(tc.key); got != tc.want {
			t.Errorf("Slot(%q) = %d; want %d", tc.key, got, tc.want)
		}
	}
	if Slot("{}foo") == Slot("foo") {
		t.Errorf("Slot(%q): an empty tag must hash the whole key", "{}foo")
	}
}

// TestScriptsNameSuffixes: the names the scripts build from the lock key
// are the ones the Go side knows them by.
func TestScriptsNameSuffixes(t *testing.T) {
	for _, c := range []struct {
		src, suffix string
	}{
		{extendSrc, FenceSuffix}, {batchExtendSrc, FenceSuffix}, {releaseSrc, ReleasedSuffix},
		{releaseSrc, LabelSuffix}, {extendSrc, LabelSuffix}, {cleanupSrc, DeadInfix}, {acquireSrc, DeadInfix},
	} {
		if !strings.Contains(c.src, "KEYS[1] .. '"+c.suffix+"'") && !strings.Contains(c.src, "KEYS[i] .. '"+c.suffix+"'") {
			t.Errorf("a script does not build its key name with %q:\n%s", c.suffix, c.src)
		}
	}
	if !strings.Contains(graceSrc, "FENCE_GRACE_MS = 10000") || FenceGrace != 10*time.Second {
		t.Errorf("graceSrc = %q; want FenceGrace, %v, in milliseconds", graceSrc, FenceGrace)
	}
}

// TestWaitedMark checks that the scripts' mark is WaitedMark, and that
// only AcquireQuiet's text turns the marking of refused holders off.
func TestWaitedMark(t *testing.T) {
	if WaitedMark != "\x00" || !strings.Contains(waitedSrc, `local WAITED = '\0'`) {
		t.Errorf("WaitedMark = %q, waited.lua's WAITED differs or is gone", WaitedMark)
	}
	if !strings.Contains(waitedSrc, "local MARK_REFUSED = true") {
		t.Fatal("waited.lua does not set MARK_REFUSED = true: AcquireQuiet's replace finds nothing")
	}
	if Acquire.Hash() == AcquireQuiet.Hash() {
		t.Error("AcquireQuiet is Acquire: the replace changed nothing")
	}
}
