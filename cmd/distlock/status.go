//go:build unix

package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strconv"
	"text/tabwriter"
	"time"

	"github.com/distlock/distlock"
)

// statusCommand prints who holds the lock of cfg, read with the store's
// inspection (nothing is taken or written), and returns the exit status:
// 0 when held, exitFree when free.
func statusCommand(cfg *statusConfig, stdout, stderr io.Writer) int {
	say := func(format string, args ...any) { fmt.Fprint(stderr, line(format, args...)) }
	ctx, cancel := context.WithTimeout(context.Background(), setupTimeout)
	res, closeClients, err := cfg.store.Open(ctx, defaultTTL)
	cancel()
	if err != nil {
		say("store %s: %v", cfg.store, err)
		if errors.Is(err, distlock.ErrInvalid) { // --table, found bad before any I/O
			return exitUsage
		}
		return exitUnavailable
	}
	defer closeClients()
	d, err := distlock.New(res, distlock.WithDefaultTTL(defaultTTL), distlock.WithCloseTimeout(releaseTimeout))
	if err != nil {
		if c, ok := res.(io.Closer); ok {
			c.Close()
		}
		say("store %s: %v", cfg.store, err)
		return exitUnavailable
	}
	defer d.Close() // it holds nothing: it closes the store's resource

	if cfg.kind == distlock.KindElection {
		return electionStatus(d, cfg, stdout, say)
	}
	// Inspect is bounded by the facade (one attempt's bound, 1s).
	var info distlock.Info
	switch cfg.kind {
	case distlock.KindSemaphore:
		info, err = d.Semaphore(cfg.key, cfg.limit).Inspect(context.Background())
	case distlock.KindWrite:
		info, err = d.RWMutex(cfg.key).Inspect(context.Background())
	default:
		info, err = d.Inspect(context.Background(), cfg.key)
	}
	switch {
	case errors.Is(err, distlock.ErrInvalid), errors.Is(err, distlock.ErrUnsupported):
		say("status: %v", err)
		return exitUsage
	case err != nil:
		say("inspecting %s on %s: %v", quoteKey(cfg.key), cfg.store, err)
		return exitUnavailable
	}
	if cfg.json {
		err = writeJSON(stdout, cfg.store.String(), info)
	} else {
		err = writeText(stdout, info)
	}
	if err != nil {
		say("%v", err)
		return exitUnavailable
	}
	if !info.Held() {
		return exitFree
	}
	return 0
}

// statusJSON is the output of `distlock status --json`.
type statusJSON struct {
	Store   string       `json:"store"`
	Key     string       `json:"key"`
	Kind    string       `json:"kind"` // "mutex", "semaphore" or "rwlock"
	Held    bool         `json:"held"`
	Limit   int          `json:"limit,omitempty"` // a held semaphore's
	Holders []holderJSON `json:"holders"`         // [] when free
}

type holderJSON struct {
	Label string `json:"label"`  // HOST:PID for distlock's runs; "" if none was given
	Kind  string `json:"kind"`   // "mutex", "semaphore", "read" or "write"
	Token uint64 `json:"token"`  // 0 on Redlock
	TTLms *int64 `json:"ttl_ms"` // the time left by the store's clock; null if the store cannot tell
}

func writeJSON(w io.Writer, store string, info distlock.Info) error {
	out := statusJSON{Store: store, Key: info.Key, Kind: lockKind(info.Kind), Held: info.Held(), Limit: info.Limit,
		Holders: []holderJSON{}}
	for _, h := range info.Holders {
		hj := holderJSON{Label: h.Label, Kind: h.Kind.String(), Token: h.Token}
		if h.TTL > 0 {
			ms := h.TTL.Milliseconds()
			hj.TTLms = &ms
		}
		out.Holders = append(out.Holders, hj)
	}
	return json.NewEncoder(w).Encode(out) // one line, as jq and scripts like it
}

// writeText writes a line that says whether the lock is held, then a
// table of its holders.
func writeText(w io.Writer, info distlock.Info) error {
	head := quoteKey(info.Key) + " (" + infoKind(info) + "): "
	readers, writers := 0, 0
	for _, h := range info.Holders {
		switch h.Kind {
		case distlock.KindRead:
			readers++
		case distlock.KindWrite:
			writers++
		}
	}
	switch {
	case !info.Held():
		head += "free"
	case info.Kind == distlock.KindSemaphore:
		head += fmt.Sprintf("%d of %d permits held", len(info.Holders), info.Limit)
	case readers > 0 && writers == 0:
		head += "held by " + plural(readers, "reader")
	case writers > 0 && readers == 0:
		head += "held by " + plural(writers, "writer")
	case info.Kind == distlock.KindWrite:
		head += "held by " + plural(readers, "reader") + " and " + plural(writers, "writer")
	default:
		head += "held"
	}
	if _, err := fmt.Fprintln(w, head); err != nil || !info.Held() {
		return err
	}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "  HOLDER\tKIND\tTOKEN\tTIME LEFT")
	for _, h := range info.Holders {
		label, left := h.Label, "unknown"
		if label == "" {
			label = "-"
		}
		if h.TTL > 0 {
			left = h.TTL.Round(time.Millisecond).String()
		}
		fmt.Fprintf(tw, "  %s\t%v\t%d\t%s\n", label, h.Kind, h.Token, left)
	}
	return tw.Flush()
}

// lockKind names the kind of an inspected lock for --json.
func lockKind(kind distlock.Kind) string {
	if kind == distlock.KindWrite || kind == distlock.KindRead {
		return "rwlock"
	}
	return kind.String()
}

// infoKind names the kind of an inspected lock for the text output.
func infoKind(info distlock.Info) string {
	switch info.Kind {
	case distlock.KindSemaphore:
		if info.Held() {
			return "semaphore, limit " + strconv.Itoa(info.Limit)
		}
		return "semaphore"
	case distlock.KindRead, distlock.KindWrite:
		return "read/write lock"
	}
	return info.Kind.String()
}

func plural(n int, noun string) string {
	if n == 1 {
		return "1 " + noun
	}
	return strconv.Itoa(n) + " " + noun + "s"
}
