package history

import (
	"fmt"
	"sort"
)

// Interval is one holding of the lock, as its worker saw it.
type Interval struct {
	Owner string
	Proc  string
	Token uint64
	Lock  string // the Acquire's Lock: "" (mutex), "semaphore", "read", "write"
	// Call is when TryLock was called, Start when it returned the lock.
	Call, Start int64
	// End is the first of: the call of Unlock, the moment the holder saw
	// Done closed, the end of the history.
	End int64
	// EndedBy is "unlock", "lost" or "end".
	EndedBy string
}

// String describes the holding for logs.
func (iv Interval) String() string {
	return fmt.Sprintf("%s(%s token %d, %d..%d %s)", iv.Owner, iv.Proc, iv.Token, iv.Start, iv.End, iv.EndedBy)
}

// Intervals returns the holdings in evs, ordered by Start.
func Intervals(evs []Event) []Interval {
	var last int64
	byOwner := map[string]*Interval{}
	var order []string
	for _, e := range evs {
		last = max(last, e.Time(), e.Call, e.Return)
		switch e.Kind {
		case Acquire:
			if e.Err == "" {
				byOwner[e.Owner] = &Interval{Owner: e.Owner, Proc: e.Proc, Token: e.Token, Lock: e.Lock, Call: e.Call, Start: e.Return}
				order = append(order, e.Owner)
			}
		case Release:
			if iv := byOwner[e.Owner]; iv != nil && iv.EndedBy == "" {
				iv.End, iv.EndedBy = e.Call, "unlock"
			}
		case Lost:
			if iv := byOwner[e.Owner]; iv != nil && iv.EndedBy == "" {
				iv.End, iv.EndedBy = e.At, "lost"
			}
		}
	}
	out := make([]Interval, 0, len(order))
	for _, o := range order {
		iv := *byOwner[o]
		if iv.EndedBy == "" {
			iv.End, iv.EndedBy = last, "end"
		}
		out = append(out, iv)
	}
	sort.SliceStable(out, func(i, j int) bool { return out[i].Start < out[j].Start })
	return out
}

// Overlap is two holdings that intersect in time: both workers believed
// they held the lock from From to To. Older began first.
type Overlap struct {
	Older, Newer Interval
	From, To     int64
}

// String describes the overlap for logs.
func (o Overlap) String() string {
	return fmt.Sprintf("%v and %v overlap for %.3fms", o.Older, o.Newer, float64(o.To-o.From)/1e6)
}

// Overlaps returns every pair of holdings in evs that intersect. Holdings
// the library ended by closing Done count only up to that moment.
func Overlaps(evs []Event) []Overlap {
	ivs := Intervals(evs)
	var out []Overlap
	for i, a := range ivs {
		for _, b := range ivs[i+1:] {
			if b.Start >= a.End {
				break // ivs is sorted by Start: no later one begins before a ends
			}
			out = append(out, Overlap{Older: a, Newer: b, From: b.Start, To: min(a.End, b.End)})
		}
	}
	return out
}

// Exclusive reports whether an overlap breaks the lock's rule: any two
// holders of a mutex, a writer with any other holder of a read/write
// lock; never two permits of a semaphore (see [MostHolders]) or two
// readers.
func (o Overlap) Exclusive() bool {
	switch {
	case o.Older.Lock == "semaphore" && o.Newer.Lock == "semaphore":
		return false
	case o.Older.Lock == "read" && o.Newer.Lock == "read":
		return false
	}
	return true
}

// MostHolders returns the largest number of holdings of evs that
// intersect at one moment, and that moment: for a semaphore, what must
// never exceed its limit.
func MostHolders(evs []Event) (n int, at int64) {
	type edge struct {
		t     int64
		delta int
	}
	var edges []edge
	for _, iv := range Intervals(evs) {
		edges = append(edges, edge{iv.Start, 1}, edge{iv.End, -1})
	}
	// Ends before starts at the same instant: holdings that touch do not
	// intersect (as in Overlaps).
	sort.Slice(edges, func(i, j int) bool {
		if edges[i].t != edges[j].t {
			return edges[i].t < edges[j].t
		}
		return edges[i].delta < edges[j].delta
	})
	cur := 0
	for _, e := range edges {
		cur += e.delta
		if cur > n {
			n, at = cur, e.t
		}
	}
	return n, at
}

// StaleWrite is a write the fenced store accepted from Owner after it had
// accepted one from Newer, an acquisition that began after Owner's had
// returned.
type StaleWrite struct {
	Write Event
	Newer string
}

// StaleWrites returns the stale writes the fenced store accepted ([StoreWrite]
// events, in the store's order). Writes by owners whose acquisition is not
// in evs are not judged.
func StaleWrites(evs []Event) []StaleWrite {
	acq := map[string]Event{}
	var writes []Event
	for _, e := range evs {
		switch {
		case e.Kind == Acquire && e.Err == "":
			acq[e.Owner] = e
		case e.Kind == StoreWrite:
			writes = append(writes, e)
		}
	}
	sort.SliceStable(writes, func(i, j int) bool { return writes[i].Seq < writes[j].Seq })
	var out []StaleWrite
	var newest Event // acquisition, among owners of writes accepted so far, that began last
	for _, w := range writes {
		if !w.Accepted {
			continue
		}
		a, ok := acq[w.Owner]
		if !ok {
			continue
		}
		if newest.Owner != "" && newest.Owner != w.Owner && newest.Call > a.Return {
			out = append(out, StaleWrite{Write: w, Newer: newest.Owner})
		}
		if a.Call > newest.Call {
			newest = a
		}
	}
	return out
}

// Counter is what became of the unfenced counter.
type Counter struct {
	// Increments is how many read-modify-writes reached the store.
	Increments int64
	// Final is the counter's last value (it starts at 0).
	Final int64
	// Lost is Increments - Final: increments another holder's write
	// overwrote.
	Lost int64
}

// LostIncrements counts the [StoreIncr] events and the counter's final
// value.
func LostIncrements(evs []Event) Counter {
	var c Counter
	var lastSeq int64 = -1
	for _, e := range evs {
		if e.Kind != StoreIncr {
			continue
		}
		c.Increments++
		if e.Seq > lastSeq {
			lastSeq, c.Final = e.Seq, e.Wrote
		}
	}
	c.Lost = c.Increments - c.Final
	return c
}

// TokenIssue is an acquisition whose token is not larger than that of an
// acquisition that had returned before it began.
type TokenIssue struct {
	Earlier, Later Event
}

// Duplicate reports whether both acquisitions got the same token.
func (ti TokenIssue) Duplicate() bool { return ti.Earlier.Token == ti.Later.Token }

// String describes the issue for logs.
func (ti TokenIssue) String() string {
	what := "regressed"
	if ti.Duplicate() {
		what = "duplicated"
	}
	return fmt.Sprintf("token %s: %s got %d after %s had returned %d", what,
		ti.Later.Owner, ti.Later.Token, ti.Earlier.Owner, ti.Earlier.Token)
}

// TokenOrder returns the acquisitions whose token did not increase in real
// time: tokens must strictly increase from an acquisition to any that
// begins after it returned. Acquisitions with token 0 (a backend without
// tokens) are ignored.
func TokenOrder(evs []Event) []TokenIssue {
	var acqs []Event
	for _, e := range evs {
		if e.Kind == Acquire && e.Err == "" && e.Token != 0 {
			acqs = append(acqs, e)
		}
	}
	byReturn := append([]Event(nil), acqs...)
	sort.SliceStable(byReturn, func(i, j int) bool { return byReturn[i].Return < byReturn[j].Return })
	sort.SliceStable(acqs, func(i, j int) bool { return acqs[i].Call < acqs[j].Call })
	var out []TokenIssue
	var best Event // largest token among acquisitions returned so far
	k := 0
	for _, b := range acqs {
		for k < len(byReturn) && byReturn[k].Return < b.Call {
			if byReturn[k].Token > best.Token {
				best = byReturn[k]
			}
			k++
		}
		if best.Owner != "" && b.Token <= best.Token {
			out = append(out, TokenIssue{Earlier: best, Later: b})
		}
	}
	return out
}

// Acquisitions counts the successful acquisitions in evs.
func Acquisitions(evs []Event) int {
	n := 0
	for _, e := range evs {
		if e.Kind == Acquire && e.Err == "" {
			n++
		}
	}
	return n
}

// Rejected counts the writes the fenced store refused.
func Rejected(evs []Event) int {
	n := 0
	for _, e := range evs {
		if e.Kind == StoreWrite && !e.Accepted {
			n++
		}
	}
	return n
}
