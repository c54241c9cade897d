package distlock

import (
	"testing"
	"unsafe"

	"github.com/distlock/distlock/backend"
)

// A held lock's facade state is one grant (its Lease and first handle
// inside), its owner value and a scheduler entry; the Request and the
// acquisition's context live in the grant only with handlers, or until
// the commit. The grant must fit the 208-byte size class: a field more
// pushes every held lock to the next (224).
func TestGrantFootprint(t *testing.T) {
	t.Logf("grant %d B (Lease %d, first Lock %d); acquisition %d (acqCtx %d, Request %d), dropped at the commit; grantRequest %d (with handlers); grantExtras %d (made on demand)",
		unsafe.Sizeof(grant{}), unsafe.Sizeof(backend.Lease{}), unsafe.Sizeof(Lock{}),
		unsafe.Sizeof(acquisition{}), unsafe.Sizeof(acqCtx{}), unsafe.Sizeof(Request{}),
		unsafe.Sizeof(grantRequest{}), unsafe.Sizeof(grantExtras{}))
	if n := unsafe.Sizeof(grant{}); n > 208 {
		t.Errorf("a grant is %d bytes; want at most 208 (a size class: the heap per held lock)", n)
	}
	if n := unsafe.Sizeof(Lock{}); n > 16 {
		t.Errorf("a Lock is %d bytes; want at most 16", n)
	}
}
