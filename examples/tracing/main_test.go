package main

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"
)

// span is what the test reads of the stdout exporter's JSON.
type span struct {
	Name        string
	SpanContext struct{ SpanID string }
	Parent      struct{ SpanID string }
	Links       []struct{ SpanContext struct{ SpanID string } }
	Attributes  []struct {
		Key   string
		Value struct{ Value any }
	}
}

func (s span) attr(key string) any {
	for _, a := range s.Attributes {
		if a.Key == key {
			return a.Value.Value
		}
	}
	return nil
}

func TestSpans(t *testing.T) {
	var out bytes.Buffer
	if err := run(t.Context(), &out); err != nil {
		t.Fatal(err)
	}
	byName := map[string][]span{}
	byID := map[string]span{}
	dec := json.NewDecoder(&out)
	for dec.More() {
		var s span
		if err := dec.Decode(&s); err != nil {
			t.Fatal(err)
		}
		byName[strings.Fields(s.Name)[0]] = append(byName[strings.Fields(s.Name)[0]], s)
		byID[s.SpanContext.SpanID] = s
	}
	if n := len(byName["job"]); n != 4 {
		t.Errorf("%d job spans; want 4", n)
	}
	outcomes := map[any]int{}
	for _, s := range byName["distlock.acquire"] {
		outcomes[s.attr("distlock.outcome")]++
		if p := byID[s.Parent.SpanID].Name; !strings.HasPrefix(p, "job") && p != "peek" {
			t.Errorf("acquisition span under %q; want a job's or peek's", p)
		}
	}
	if outcomes["held"] != 4 || outcomes["not_acquired"] != 1 {
		t.Errorf("acquisition outcomes %v; want 4 held, 1 not_acquired", outcomes)
	}
	for _, s := range byName["distlock.hold"] {
		if s.attr("distlock.outcome") != "released" {
			t.Errorf("hold outcome %v; want released", s.attr("distlock.outcome"))
		}
		if len(s.Links) != 1 || byID[s.Links[0].SpanContext.SpanID].Name != "distlock.acquire" {
			t.Errorf("hold span links %v; want its acquisition span", s.Links)
		}
	}
	if n := len(byName["distlock.hold"]); n != 4 {
		t.Errorf("%d hold spans; want 4", n)
	}
}
