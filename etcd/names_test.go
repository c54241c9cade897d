package etcd

import (
	"fmt"
	"math/rand/v2"
	"strconv"
	"strings"
	"testing"
	"unsafe"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/distlock/distlock/backend"
)

// TestHandleSize: a held lock on a shared lease that the lease keeps
// alive costs its handle, which must stay in the 64 B size class (with
// the facade's grant and owner value, 300 B per held lock: issue 32).
func TestHandleSize(t *testing.T) {
	if got := unsafe.Sizeof(handle{}); got > 64 {
		t.Errorf("handle is %d B; want at most 64", got)
	}
}

// TestQueueName: the queue key made again from a handle (name) is the
// one the layout in kinds.go describes, its directory and name space are
// its prefixes, and parseName reads it back, for every kind and keys
// that need escaping; parseName takes no key that name does not make for
// this Resource.
func TestQueueName(t *testing.T) {
	r := mustNew(t, &clientv3.Client{}, WithPrefix("/p/q"))
	keys := []string{"k", "k/", "k%", "k%2F", ".", "..", "a/b", "é", "!sem", "-0", "a b\x00"}
	kinds := []struct {
		kind  backend.Kind
		limit int32
	}{{backend.KindMutex, 0}, {backend.KindSemaphore, 1}, {backend.KindSemaphore, 2147483647}, {backend.KindRead, 0}, {backend.KindWrite, 0}}
	for _, k := range keys {
		for _, kl := range kinds {
			for _, slot := range []int32{0, 1, 9, 10, 63, 64, 1000} {
				h := &handle{lockKey: k, slot: slot, sess: &session{r: r}}
				h.flags.Store(uint32(kl.kind) << kindShift)
				if kl.kind == backend.KindSemaphore {
					h.x = &extra{limit: kl.limit}
				}
				dir := r.queueDir(kl.kind, k)
				ns := dir + tag(kl.kind, int(kl.limit))
				want := ns + r.id + "-" + strconv.Itoa(int(slot))
				n := r.name(h)
				if n.key != want || n.dir() != dir || n.ns() != ns {
					t.Fatalf("name of %q %v slot %d = %q (dir %q, ns %q); want %q (dir %q, ns %q)", k, kl.kind, slot, n.key, n.dir(), n.ns(), want, dir, ns)
				}
				kind, limit, key, s, ok := r.parseName(n.key)
				if !ok || kind != kl.kind || limit != int(kl.limit) || key != k || s != int(slot) {
					t.Errorf("parseName(%q) = %v, %d, %q, %d, %v; want %v, %d, %q, %d", n.key, kind, limit, key, s, ok, kl.kind, kl.limit, k, slot)
				}
			}
		}
	}
	other := mustNew(t, &clientv3.Client{}, WithPrefix("/p/q"))
	h := &handle{lockKey: "k", sess: &session{r: r}, slot: 12}
	p := r.name(h).key
	for _, bad := range []string{
		p + "x", p[:len(p)-2] + "012", strings.Replace(p, "/p/q/", "/p/Q/", 1),
		other.name(&handle{lockKey: "k", sess: &session{r: other}, slot: 12}).key,
		"/p/q/!fence/1a2b/k/" + r.id + "-12", "/p/q/k%2f/" + r.id + "-1", "/p/q/%6B/" + r.id + "-1",
		"/p/q/k/x" + r.id + "-1", "/p/q/!rw/k/x-" + r.id + "-1", "/p/q/!sem/k/" + r.id + "-1",
		"/p/q/k/" + r.id + "-", "/p/q/k/" + r.id + "-+1", "/p/q/k/" + r.id + "-1a", "/p/q/k" + r.id + "-1", "",
	} {
		if kind, limit, key, s, ok := r.parseName(bad); ok {
			t.Errorf("parseName(%q) = %v, %d, %q, %d, true; want not ours", bad, kind, limit, key, s)
		}
	}
}

// TestNameTable checks take and free against a model: a name is never
// given to two handles in use at once, take gives the lowest free slot
// of the name space, and find finds exactly the handles in use, across
// the table's growth.
func TestNameTable(t *testing.T) {
	seed := rand.Uint64()
	t.Logf("seed %d", seed)
	rng := rand.New(rand.NewPCG(seed, 0))
	intn := func(lo, hi int) int { return lo + rng.IntN(hi-lo+1) }
	for range 20 {
		r := mustNew(t, &clientv3.Client{})
		kinds := []backend.Kind{backend.KindMutex, backend.KindSemaphore, backend.KindRead, backend.KindWrite}
		var live []*handle
		used := map[string]map[int32]bool{} // name space -> slots in use
		space := func(h *handle) string { return fmt.Sprint(h.kind(), h.limit(), h.lockKey) }
		for i := intn(1, 400); i > 0; i-- {
			if len(live) > 0 && intn(0, 2) == 0 {
				j := intn(0, len(live)-1)
				h := live[j]
				live = append(live[:j], live[j+1:]...)
				r.free(h)
				r.free(h) // a second free gives nothing back
				delete(used[space(h)], h.slot)
				continue
			}
			l := &backend.Lease{Key: "k" + strconv.Itoa(intn(0, 40)), Kind: kinds[intn(0, 3)]}
			if l.Kind == backend.KindSemaphore {
				l.Limit = int32(intn(1, 2))
			}
			h := r.newHandle(l, &session{r: r}, 0, 0)
			sp := space(h)
			if used[sp] == nil {
				used[sp] = map[int32]bool{}
			}
			var lowest int32
			for used[sp][lowest] {
				lowest++
			}
			if h.slot != lowest {
				t.Fatalf("take gave %s slot %d; want the lowest free, %d", sp, h.slot, lowest)
			}
			used[sp][h.slot] = true
			live = append(live, h)
		}
		w := &r.watch
		w.mu.Lock()
		if w.names.n != len(live) {
			t.Fatalf("the table holds %d handles; want %d", w.names.n, len(live))
		}
		for _, h := range live {
			if got := w.names.find(h.kind(), h.limit(), h.lockKey, int(h.slot)); got != h {
				t.Fatalf("find(%s slot %d) = %p; want %p", space(h), h.slot, got, h)
			}
		}
		if got := w.names.find(backend.KindMutex, 0, "k0", 10000); got != nil {
			t.Fatalf("find of a name never given = %p; want nil", got)
		}
		w.mu.Unlock()
	}

	// Beyond 64 acquisitions of one lock at once.
	r := mustNew(t, &clientv3.Client{})
	var hs []*handle
	for i := range 70 {
		h := r.newHandle(&backend.Lease{Key: "k"}, &session{r: r}, 0, 0)
		if int(h.slot) != i {
			t.Fatalf("acquisition %d took slot %d; want %d", i, h.slot, i)
		}
		hs = append(hs, h)
	}
	r.free(hs[66])
	r.free(hs[3])
	for _, want := range []int32{3, 66, 70} {
		if h := r.newHandle(&backend.Lease{Key: "k"}, &session{r: r}, 0, 0); h.slot != want {
			t.Errorf("took slot %d; want %d", h.slot, want)
		}
	}
}
