//go:build unix

package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"strconv"
	"time"

	"github.com/distlock/distlock"
	"github.com/distlock/distlock/backend"
)

// `distlock run --elect NAME -- COMMAND` runs COMMAND while this process
// leads the election NAME (distlock.Election): a singleton service under
// a supervisor. It is `run` with a campaign for the acquisition, as
// `consul lock` runs its child under the leader election of a prefix: the
// command starts once elected, is stopped when the leadership is lost, and
// distlock exits with its status when it exits (the supervisor starts
// distlock again, which campaigns again). The term is in the command's
// environment. Without COMMAND, distlock campaigns and holds the
// leadership until a signal, as `etcdctl elect NAME PROPOSAL` does.
// `distlock status --elect NAME` reads the leader, as `etcdctl elect
// --listen` shows it, without campaigning.

// storeKey is the key the store holds for KEY of kind: an election's
// mutex for --elect.
func storeKey(key string, kind distlock.Kind) string {
	if kind == distlock.KindElection {
		return backend.ElectionPrefix + key
	}
	return key
}

// electFlags checks --value and --wait against --elect.
func electFlags(fs *flag.FlagSet, cfg *runConfig, value string) error {
	if cfg.kind != distlock.KindElection {
		if isSet(fs, "value") {
			return usageErrorf("run: --value publishes a leader's value: it goes with --elect")
		}
		return nil
	}
	if cfg.wait == 0 {
		return usageErrorf("run: --elect with %s: a campaign waits until elected (or for --wait > 0); for one attempt, take the mutex KEY (no --elect)", flagName(setOf(fs, "wait", "w", "n")))
	}
	cfg.value = value
	return nil
}

// campaign campaigns for the election cfg.key, within cfg.wait.
func campaign(ctx context.Context, d *distlock.DistributeLock, cfg *runConfig) (*distlock.Lock, error) {
	if cfg.wait != distlock.WaitForever {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, cfg.wait)
		defer cancel()
	}
	// A wait that ends is errors.Join(ErrNotAcquired, its error): run's
	// --conflict-exit-code.
	return d.Election(cfg.key).Campaign(ctx, cfg.value)
}

// electionEnv is what COMMAND gets in its environment besides DISTLOCK_KEY
// and DISTLOCK_TOKEN when it runs as the leader: the election's name and
// the term (the leadership's token, as DISTLOCK_TOKEN).
func electionEnv(cfg *runConfig, lk *distlock.Lock) []string {
	if cfg.kind != distlock.KindElection {
		return nil
	}
	return []string{"DISTLOCK_ELECTION=" + cfg.key, "DISTLOCK_TERM=" + strconv.FormatUint(lk.Token(), 10)}
}

// leaderJSON is the output of `distlock status --elect --json`.
type leaderJSON struct {
	Store    string `json:"store"`
	Election string `json:"election"`
	Led      bool   `json:"led"`
	Label    string `json:"label,omitempty"` // the leader's HOST:PID for distlock's runs
	Value    string `json:"value,omitempty"` // what the leader published (--value)
	Term     uint64 `json:"term,omitempty"`  // 0 on Redlock
	TTLms    *int64 `json:"ttl_ms"`          // the time left by the store's clock; null if unknown or no leader
}

// electionStatus prints the leader of the election cfg.key and returns
// the exit status: 0 when it has one, exitFree when not.
func electionStatus(d *distlock.DistributeLock, cfg *statusConfig, stdout io.Writer, say func(string, ...any)) int {
	l, err := d.Election(cfg.key).Leader(context.Background())
	led := err == nil
	switch {
	case errors.Is(err, distlock.ErrNoLeader):
	case errors.Is(err, distlock.ErrInvalid), errors.Is(err, distlock.ErrUnsupported):
		say("status: %v", err)
		return exitUsage
	case err != nil:
		say("reading the leader of %s on %s: %v", quoteKey(cfg.key), cfg.store, err)
		return exitUnavailable
	}
	if cfg.json {
		out := leaderJSON{Store: cfg.store.String(), Election: cfg.key, Led: led, Label: l.Label, Value: l.Value, Term: l.Term}
		if l.TTL > 0 {
			ms := l.TTL.Milliseconds()
			out.TTLms = &ms
		}
		err = json.NewEncoder(stdout).Encode(out)
	} else {
		err = writeLeader(stdout, cfg.key, led, l)
	}
	if err != nil {
		say("%v", err)
		return exitUnavailable
	}
	if !led {
		return exitFree
	}
	return 0
}

// writeLeader writes the leader as text: one line.
func writeLeader(w io.Writer, name string, led bool, l distlock.Leader) error {
	if !led {
		_, err := fmt.Fprintf(w, "%s (election): no leader\n", quoteKey(name))
		return err
	}
	label, value, left := l.Label, strconv.Quote(l.Value), "unknown"
	if label == "" {
		label = "-"
	}
	if l.TTL > 0 {
		left = l.TTL.Round(time.Millisecond).String()
	}
	_, err := fmt.Fprintf(w, "%s (election): led by %s, value %s, term %d, time left %s\n", quoteKey(name), label, value, l.Term, left)
	return err
}
