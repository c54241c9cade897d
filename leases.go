package distlock

import (
	"time"

	"github.com/distlock/distlock/backend"
)

// subLeases returns one lease per key of the grant, the first g.lease
// itself.
func (g *grant) subLeases() []*backend.Lease {
	if m := g.extras.Load(); m != nil && m.subs != nil {
		return m.subs
	}
	return []*backend.Lease{&g.lease}
}

// validityAll is the shortest safe validity of a lock's leases.
func validityAll(subs []*backend.Lease) time.Duration {
	v := safeValidity(*subs[0])
	for _, l := range subs[1:] {
		v = min(v, safeValidity(*l))
	}
	return v
}
