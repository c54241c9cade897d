package zookeeper

import (
	"net/url"
	"strconv"
	"testing"
	"time"
)

func TestRecord(t *testing.T) {
	for _, r := range []record{
		{value: "9f86d081884c7d65", label: "host-a:123", ttl: 600 * time.Millisecond},
		{value: "9f86d081884c7d65", label: "", kept: true},
		{value: "v&=%", label: "a b&c=d%\x00\xff", ttl: time.Hour},
	} {
		b := r.encode()
		if got := decodeRecord(b); got != r {
			t.Errorf("decodeRecord(%q) = %+v; want %+v", b, got, r)
		}
		// What url.Values.Encode writes, so that tools read it as a query.
		v := url.Values{"v": {recordVersion}, "value": {r.value}, "label": {r.label}}
		if r.kept {
			v.Set("keep", "session")
		} else {
			v.Set("ttl", strconv.FormatInt(r.ttl.Milliseconds(), 10))
		}
		if want := v.Encode(); string(b) != want {
			t.Errorf("encode(%+v) = %q; want %q", r, b, want)
		}
	}
	// The data of a child another client made is its owner value.
	if got := decodeRecord([]byte("9f86d081884c7d65")); got != (record{value: "9f86d081884c7d65"}) {
		t.Errorf("decodeRecord of a bare value = %+v", got)
	}
}
