package redlock

import (
	"time"

	"github.com/distlock/distlock/backend"
)

// HolderTTL runs holderTTL on replies built from vs, where a v of 99
// stands for a failed node.
func HolderTTL(vs []int64, need int) time.Duration {
	res := make([]reply, len(vs))
	for i, v := range vs {
		res[i] = reply{v: v}
		if v == 99 {
			res[i] = reply{err: ErrNoQuorum}
		}
	}
	return holderTTL(res, need)
}

// Workers returns how many worker goroutines the Resource's nodes run.
func (r *Resource) Workers() int {
	n := 0
	for _, nd := range r.nodes {
		n += int(nd.workers.Load())
	}
	return n
}

// PauseAfterWait makes every acquire sleep d between its round's wait and
// its decision, as a GC pause or a descheduled goroutine would, until the
// returned func restores it.
func PauseAfterWait(d time.Duration) (restore func()) {
	testHookAfterWait = func() { time.Sleep(d) }
	return func() { testHookAfterWait = nil }
}

// Stored returns what the nodes hold for l's last acquire round: l.Value
// and the round's number ("" before the first round).
func Stored(l *backend.Lease) string {
	if h, ok := l.Handle.(*handle); ok {
		return h.acquire[4].(string)
	}
	return ""
}
