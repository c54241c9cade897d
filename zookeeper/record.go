package zookeeper

import (
	"net/url"
	"strconv"
	"time"

	"github.com/distlock/distlock/backend"
)

// record is what a child's data says of its holder, for inspection: the
// owner value, the label, and how long the holder keeps the lock (its
// TTL, counted by its client), or that its session keeps it. It is
// encoded as a URL query, readable in zkCli:
//
//	keep=session&label=host-a%3A123&v=1&value=9f86d0...
//	label=&ttl=600&v=1&value=9f86d0...
//
// ttl is in milliseconds. Nothing compares the record: the owner is the
// child itself (its path, under its session), the label is shown only.
type record struct {
	value string
	label string
	ttl   time.Duration // counted from the data's mtime; unused when kept
	kept  bool          // the holder's session keeps the lock, not a TTL
}

const recordVersion = "1"

func recordOf(l *backend.Lease) record {
	return record{value: l.Value, label: l.Label, ttl: l.TTL, kept: l.AutoRenew}
}

// encode writes r as url.Values.Encode would (keys sorted), in one
// allocation.
func (r record) encode() []byte {
	value, label := url.QueryEscape(r.value), url.QueryEscape(r.label)
	b := make([]byte, 0, len(value)+len(label)+48)
	if r.kept {
		b = append(b, "keep=session&"...)
	}
	b = append(b, "label="...)
	b = append(b, label...)
	if !r.kept {
		b = append(b, "&ttl="...)
		b = strconv.AppendInt(b, r.ttl.Milliseconds(), 10)
	}
	b = append(b, "&v="+recordVersion+"&value="...)
	return append(b, value...)
}

// decodeRecord reads a child's data. Data that is not a record (a
// child made by another client, whose data is its owner value) is the
// value, with no label and an unknown TTL.
func decodeRecord(b []byte) record {
	v, err := url.ParseQuery(string(b))
	if err != nil || v.Get("v") != recordVersion {
		return record{value: string(b)}
	}
	r := record{value: v.Get("value"), label: v.Get("label"), kept: v.Get("keep") == "session"}
	if ms, err := strconv.ParseInt(v.Get("ttl"), 10, 64); err == nil && ms > 0 {
		r.ttl = time.Duration(ms) * time.Millisecond
	}
	return r
}
