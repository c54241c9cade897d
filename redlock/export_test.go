package redlock

// HolderTTL exposes holderTTL to the tests.
var HolderTTL = holderTTL

// Reply builds a reply for HolderTTL's tests: an answer v, or a failure.
func Reply(v int64, failed bool) reply {
	if failed {
		return reply{done: true, err: errFailedForTest}
	}
	return reply{v: v, done: true}
}

var errFailedForTest = ErrNoQuorum

// Workers returns how many worker goroutines the Resource's nodes run.
func (r *Resource) Workers() int {
	n := 0
	for _, nd := range r.nodes {
		n += int(nd.workers.Load())
	}
	return n
}
