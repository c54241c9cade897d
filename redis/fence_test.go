package redis_test

import (
	"context"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/distlock/distlock"
	"github.com/distlock/distlock/fence"
	"github.com/distlock/distlock/internal/redisscript"
	"github.com/distlock/distlock/redis"
)

// appendScript appends ARGV[1] to the list KEYS[2] and sets KEYS[1] to
// it: a fenced write whose order the list keeps.
var appendScript = redis.NewFencedScript(`redis.call('RPUSH', KEYS[2], ARGV[1])
return redis.call('SET', KEYS[1], ARGV[1])`)

// TestFenceConcurrent: goroutines write one key with interleaved tokens
// (a shared counter, each token drawn 0-3 below it), by Set or by a
// script of their own that also appends the token to a list. Every
// refusal is a StaleError with a higher token; a token below one whose
// write had returned is never accepted; the list, in the server's order,
// never goes down; the key ends with the highest accepted token.
func TestFenceConcurrent(t *testing.T) {
	for _, c := range []struct {
		name   string
		client func(t testing.TB) goredis.UniversalClient
	}{
		{"Standalone", func(t testing.TB) goredis.UniversalClient { return standalone(t) }},
		{"Cluster", func(t testing.TB) goredis.UniversalClient { return cluster(t) }},
	} {
		t.Run(c.name, func(t *testing.T) {
			testFenceConcurrent(t, c.client(t))
		})
	}
}

func testFenceConcurrent(t *testing.T, c goredis.UniversalClient) {
	const workers, rounds = 8, 300
	f := newFence(t, c)
	ctx := t.Context()
	base := uniqueKey(t)
	key, list := "{"+base+"}:doc", "{"+base+"}:log"
	seed := testSeed(t)
	var next, accepted, refused atomic.Uint64
	var returned atomic.Uint64 // highest accepted token whose write returned
	var wg sync.WaitGroup
	for w := range workers {
		wg.Go(func() {
			rnd := rand.New(rand.NewPCG(seed, uint64(w)))
			for range rounds {
				tok := max(next.Add(1), 4) - uint64(rnd.IntN(4))
				floor := returned.Load()
				v := strconv.FormatUint(tok, 10)
				var err error
				if rnd.IntN(2) == 0 {
					err = f.Set(ctx, key, tok, v, 0)
				} else {
					err = f.Run(ctx, appendScript, key, tok, []string{list}, v).Err()
				}
				var se *fence.StaleError
				switch {
				case err == nil:
					if tok < floor {
						t.Errorf("token %d accepted after %d had been", tok, floor)
					}
					for h := returned.Load(); tok > h && !returned.CompareAndSwap(h, tok); h = returned.Load() {
					}
					accepted.Add(1)
				case errors.As(err, &se):
					refused.Add(1)
					if se.Highest <= tok || se.Token != tok || se.Resource != key {
						t.Errorf("refusal of %d: %+v", tok, se)
					}
				default:
					t.Errorf("token %d: %v", tok, err)
				}
			}
		})
	}
	wg.Wait()
	t.Logf("%d accepted, %d refused", accepted.Load(), refused.Load())
	if accepted.Load() == 0 || refused.Load() == 0 {
		t.Fatalf("%d accepted, %d refused: the tokens did not interleave", accepted.Load(), refused.Load())
	}
	got, err := c.LRange(ctx, list, 0, -1).Result()
	if err != nil {
		t.Fatal(err)
	}
	var prev uint64
	for i, s := range got {
		tok, err := strconv.ParseUint(s, 10, 64)
		if err != nil || tok < prev {
			t.Fatalf("list entry %d: %q after %d: an older token written after a newer one", i, s, prev)
		}
		prev = tok
	}
	if v, err := c.Get(ctx, key).Result(); err != nil || v != strconv.FormatUint(returned.Load(), 10) || prev > returned.Load() {
		t.Errorf("key = %q, %v; want %d, the highest accepted token", v, err, returned.Load())
	}
}

// TestFenceRules: equal tokens pass, keys have tokens of their own, Del
// keeps the fence, Set's TTL, HSet, and tokens above 2^53 (Lua's exact
// integers) compare right.
func TestFenceRules(t *testing.T) {
	c := standalone(t)
	f := newFence(t, c)
	ctx := t.Context()
	k, other, h := uniqueKey(t), uniqueKey(t), uniqueKey(t)
	stale := func(err error) uint64 {
		t.Helper()
		var se *fence.StaleError
		switch {
		case err == nil:
			return 0
		case errors.As(err, &se) && errors.Is(err, fence.ErrStale):
			return se.Highest
		}
		t.Fatalf("unexpected error: %v", err)
		return 0
	}
	steps := []struct {
		name    string
		err     error
		highest uint64
	}{
		{"set 5", f.Set(ctx, k, 5, "five", 0), 0},
		{"set 5 again", f.Set(ctx, k, 5, "five again", 0), 0},
		{"set 4", f.Set(ctx, k, 4, "four", 0), 5},
		{"other key, token 1", f.Set(ctx, other, 1, "one", 0), 0},
		{"check 4", f.Check(ctx, k, 4), 5},
		{"check 6", f.Check(ctx, k, 6), 0},
		{"set 5 after check 6", f.Set(ctx, k, 5, "five", 0), 6},
		{"del 6", f.Del(ctx, k, 6), 0},
		{"set 5 after del", f.Set(ctx, k, 5, "zombie", 0), 6},
		{"hset 3", f.HSet(ctx, h, 3, "a", "x"), 0},
		{"hset 2", f.HSet(ctx, h, 2, "b", "y"), 3},
	}
	for _, s := range steps {
		if got := stale(s.err); got != s.highest {
			t.Errorf("%s: highest %d (%v); want %d (0: accepted)", s.name, got, s.err, s.highest)
		}
	}
	if n, err := c.Exists(ctx, k).Result(); err != nil || n != 0 {
		t.Errorf("the deleted key came back: %d, %v", n, err)
	}
	if v, err := c.Get(ctx, other).Result(); err != nil || v != "one" {
		t.Errorf("other = %q, %v; want one", v, err)
	}
	if m, err := c.HGetAll(ctx, h).Result(); err != nil || len(m) != 1 || m["a"] != "x" {
		t.Errorf("hash = %v, %v; want a=x only", m, err)
	}
	// A TTL under a millisecond is rounded up, not down to PX 0 (which
	// Redis refuses): the write is accepted, and the value expires.
	if err := f.Set(ctx, other, 2, "two", 500*time.Microsecond); err != nil {
		t.Fatalf("Set with a 0.5ms TTL: %v", err)
	}
	for end := time.Now().Add(5 * time.Second); ; time.Sleep(time.Millisecond) {
		if n, err := c.Exists(ctx, other).Result(); err == nil && n == 0 {
			break
		}
		if time.Now().After(end) {
			t.Fatalf("a value set with a 0.5ms TTL still exists after 5s")
		}
	}
	// Around 2^53 and across a change of length.
	big := uniqueKey(t)
	for i, s := range []struct{ token, highest uint64 }{
		{1<<53 + 2, 0}, {1<<53 + 1, 1<<53 + 2}, {9_999_999_999_999_999_999, 0},
		{10_000_000_000_000_000_000, 0}, {9_999_999_999_999_999_999, 10_000_000_000_000_000_000},
		{math.MaxUint64, 0}, {math.MaxUint64 - 1, math.MaxUint64},
	} {
		if got := stale(f.Set(ctx, big, s.token, "v", 0)); got != s.highest {
			t.Errorf("big step %d: token %d: highest %d; want %d", i, s.token, got, s.highest)
		}
	}
}

// TestFencedScript: a script of one's own gets its key as KEYS[1], the
// keys given after it and its arguments as ARGV; its reply and errors
// come back as go-redis gives them; a refusal runs nothing.
func TestFencedScript(t *testing.T) {
	c := standalone(t)
	f := newFence(t, c)
	ctx := t.Context()
	base := uniqueKey(t)
	key, counter := "{"+base+"}:a", "{"+base+"}:n"
	s := redis.NewFencedScript(`redis.call('SET', KEYS[1], ARGV[1])
return {KEYS[1], KEYS[2], #KEYS, #ARGV, redis.call('INCRBY', KEYS[2], ARGV[2])}`)
	got, err := f.Run(ctx, s, key, 3, []string{counter}, "v", 5).Slice()
	if err != nil {
		t.Fatal(err)
	}
	if want := []any{key, counter, int64(2), int64(2), int64(5)}; fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("reply = %v; want %v", got, want)
	}
	cmd := f.Run(ctx, s, key, 2, []string{counter}, "old", 5)
	var se *fence.StaleError
	if !errors.As(cmd.Err(), &se) || se.Highest != 3 || cmd.Val() != nil {
		t.Errorf("stale Run = %v, %v; want nil, StaleError highest 3", cmd.Val(), cmd.Err())
	}
	if n, _ := c.Get(ctx, counter).Int64(); n != 5 {
		t.Errorf("counter = %d; want 5: the refused script ran", n)
	}
	failing := redis.NewFencedScript(`return redis.error_reply('MINE broke')`)
	if err := f.Run(ctx, failing, key, 3, nil).Err(); err == nil || errors.Is(err, fence.ErrStale) || !strings.Contains(err.Error(), "MINE broke") {
		t.Errorf("failing script = %v; want its own error", err)
	}
	if err := f.Run(ctx, redis.NewFencedScript(`return redis.call('GET', KEYS[1])`), key, 3, nil).Err(); err != nil {
		t.Errorf("read = %v", err)
	}
}

// TestFenceBadInput: bad input is ErrInvalid and reaches no server (no
// script call in INFO commandstats).
func TestFenceBadInput(t *testing.T) {
	c := standalone(t)
	f := newFence(t, c)
	ctx := t.Context()
	before := commandStats(t, c)
	var nilCtx context.Context
	for _, b := range []struct {
		name string
		err  error
	}{
		{"empty key", f.Set(ctx, "", 1, "v", 0)},
		{"token 0", f.Set(ctx, "k", 0, "v", 0)},
		{"check token 0", f.Check(ctx, "k", 0)},
		{"negative TTL", f.Set(ctx, "k", 1, "v", -time.Second)},
		{"'}' without a tag", f.Del(ctx, "a}b", 1)},
		{"empty tag and '}'", f.HSet(ctx, "a{}b}", 1, "f", "v")},
		{"key too long", f.Set(ctx, strings.Repeat("k", redis.MaxKeyLen+1), 1, "v", 0)},
		{"other slot", f.Run(ctx, appendScript, "{a}x", 1, []string{"{b}y"}, "v").Err()},
		{"nil script", f.Run(ctx, nil, "k", 1, nil).Err()},
		{"nil context", f.Check(nilCtx, "k", 1)},
		{"zero Fence", new(redis.Fence).Check(ctx, "k", 1)},
	} {
		if !errors.Is(b.err, distlock.ErrInvalid) {
			t.Errorf("%s: %v; want ErrInvalid", b.name, b.err)
		}
	}
	if d := statsDelta(before, commandStats(t, c)); len(d) != 0 {
		t.Errorf("commands sent for bad input: %v", d)
	}
	var nilClient *goredis.Client
	for _, nc := range []goredis.Scripter{nil, nilClient, (*goredis.ClusterClient)(nil)} {
		if f, err := redis.NewFence(nc); !errors.Is(err, distlock.ErrInvalid) || f != nil {
			t.Errorf("NewFence(%#v) = %v, %v; want nil, ErrInvalid", nc, f, err)
		}
	}
}

// newFence is NewFence over c, failing t on error.
func newFence(t testing.TB, c goredis.Scripter) *redis.Fence {
	t.Helper()
	f, err := redis.NewFence(c)
	if err != nil {
		t.Fatal(err)
	}
	return f
}

// TestFenceKeyLayout: a key's fence key hashes to its slot, and no two
// keys share one; random keys made of braces and a few letters.
func TestFenceKeyLayout(t *testing.T) {
	rnd := rand.New(rand.NewPCG(testSeed(t), 1))
	seen := map[string]string{}
	for range 20000 {
		var b strings.Builder
		for range 1 + rnd.IntN(8) {
			b.WriteByte("{}ab:"[rnd.IntN(5)])
		}
		key := b.String()
		fk, err := redis.FenceKey(key)
		if err != nil {
			if !errors.Is(err, distlock.ErrInvalid) || hasTag(key) || !strings.Contains(key, "}") {
				t.Fatalf("FenceKey(%q) = %v; want an error only for a key with '}' and no hash tag", key, err)
			}
			continue
		}
		if redisscript.Slot(fk) != redisscript.Slot(key) {
			t.Fatalf("FenceKey(%q) = %q: slot %d; the key's is %d", key, fk, redisscript.Slot(fk), redisscript.Slot(key))
		}
		if k, ok := seen[fk]; ok && k != key {
			t.Fatalf("%q and %q share the fence key %q", k, key, fk)
		}
		seen[fk] = key
	}
	for _, c := range []struct{ key, want string }{
		{"invoice:42", "{invoice:42}:fence:invoice:42"},
		{"{user1}:profile", "{user1}:fence:{user1}:profile"},
		{"a{b", "{a{b}:fence:a{b"},
	} {
		if got, err := redis.FenceKey(c.key); err != nil || got != c.want {
			t.Errorf("FenceKey(%q) = %q, %v; want %q", c.key, got, err, c.want)
		}
	}
}

// TestFenceCluster: keys of many slots, tagged or not, on a Redis
// Cluster: every fenced write lands in its key's slot (no CROSSSLOT, no
// MOVED left unfollowed), and the fence key is where the server says.
func TestFenceCluster(t *testing.T) {
	c := cluster(t)
	f := newFence(t, c)
	ctx := t.Context()
	for i := range 40 {
		key := fmt.Sprintf("%s-%d", uniqueKey(t), i)
		if i%2 == 1 {
			key = fmt.Sprintf("{%d}:%s", i, key)
		}
		if err := f.Set(ctx, key, 2, "v", time.Minute); err != nil {
			t.Fatalf("Set(%q): %v", key, err)
		}
		if err := f.Set(ctx, key, 1, "old", time.Minute); !errors.Is(err, fence.ErrStale) {
			t.Fatalf("stale Set(%q) = %v; want ErrStale", key, err)
		}
		fk, _ := redis.FenceKey(key)
		slot, err := c.ClusterKeySlot(ctx, fk).Result()
		if err != nil || slot != int64(redisscript.Slot(key)) {
			t.Fatalf("fence key %q: slot %d, %v; want %d", fk, slot, err, redisscript.Slot(key))
		}
		if v, err := c.Get(ctx, fk).Result(); err != nil || v != "2" {
			t.Fatalf("fence key %q = %q, %v; want 2", fk, v, err)
		}
	}
}

// hasTag reports whether key has a hash tag: a '{' followed, not at once,
// by a '}'.
func hasTag(key string) bool {
	s := strings.IndexByte(key, '{')
	return s >= 0 && strings.IndexByte(key[s+1:], '}') > 0
}
