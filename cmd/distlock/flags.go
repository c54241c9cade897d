//go:build unix

package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"strconv"
	"strings"
	"time"

	"github.com/distlock/distlock"
)

// runConfig is a parsed `distlock run` command line.
type runConfig struct {
	store    store
	key      string
	argv     []string      // COMMAND and its ARGS
	path     string        // COMMAND found in PATH
	wait     time.Duration // distlock.WaitForever unless --wait was given
	ttl      time.Duration
	grace    time.Duration
	conflict int
	verbose  bool
	kind     distlock.Kind // KindMutex, or KindSemaphore (--limit), KindRead (--shared), KindWrite (--exclusive)
	limit    int           // KindSemaphore: --limit
}

// Defaults of run's flags: the help text says them too.
const (
	defaultTTL   = 10 * time.Second
	defaultGrace = 5 * time.Second
)

// parseRun parses the arguments of `distlock run`. All its errors mean
// exit status 2; it does no I/O but looking COMMAND up in PATH.
func parseRun(args []string, getenv func(string) string) (*runConfig, error) {
	fs := newFlagSet("run")
	storeURL := fs.String("store", "", "")
	var wait, ttl, grace durationFlag
	fs.Var(&wait, "wait", "")
	fs.Var(&ttl, "ttl", "")
	fs.Var(&grace, "grace", "")
	conflict := fs.Int("conflict-exit-code", exitNotAcquired, "")
	limit := fs.Int("limit", 0, "")
	shared := fs.Bool("shared", false, "")
	exclusive := fs.Bool("exclusive", false, "")
	var verbose bool
	fs.BoolVar(&verbose, "v", false, "")
	fs.BoolVar(&verbose, "verbose", false, "")
	err := parseFlags(fs, args)
	if err != nil {
		return nil, err
	}
	rest := fs.Args()
	if len(rest) == 0 {
		return nil, usageErrorf("run: missing KEY and COMMAND")
	}
	// Without --wait, until acquired or interrupted (a signal ends the
	// acquisition's context).
	cfg := &runConfig{key: rest[0], wait: distlock.WaitForever, ttl: defaultTTL, grace: defaultGrace,
		conflict: *conflict, verbose: verbose}
	rest = rest[1:]
	switch {
	case len(rest) > 0 && rest[0] == "--":
		rest = rest[1:]
	case len(rest) > 0 && strings.HasPrefix(rest[0], "-"):
		return nil, usageErrorf("run: %s after KEY: flags go before KEY, COMMAND after --", rest[0])
	}
	if len(rest) == 0 {
		return nil, usageErrorf("run: missing COMMAND after KEY %q", cfg.key)
	}
	cfg.argv = rest
	if cfg.key == "" {
		return nil, usageErrorf("run: empty KEY")
	}
	if wait.set {
		cfg.wait = wait.d
	}
	if ttl.set {
		if ttl.d <= 0 {
			return nil, usageErrorf("run: --ttl %s: want a duration > 0", ttl.s)
		}
		cfg.ttl = ttl.d
	}
	if grace.set {
		cfg.grace = grace.d
	}
	if *conflict < 0 || *conflict > 255 {
		return nil, usageErrorf("run: --conflict-exit-code %d: want 0 to 255", *conflict)
	}
	if cfg.kind, cfg.limit, err = kindFlags(fs, "run", *limit, *shared, *exclusive); err != nil {
		return nil, err
	}
	s, err := storeFrom(*storeURL, getenv)
	if err != nil {
		return nil, err
	}
	cfg.store = s
	if err := s.validateKey(cfg.key); err != nil {
		return nil, fmt.Errorf("run: KEY %s: %w", quoteKey(cfg.key), err)
	}
	if err := supports(s, cfg.kind, false); err != nil {
		return nil, fmt.Errorf("run: %s: %w", kindFlag(cfg.kind), err)
	}
	path, err := lookPath(cfg.argv[0])
	if err != nil {
		return nil, err
	}
	cfg.path = path
	return cfg, nil
}

// statusConfig is a parsed `distlock status` command line.
type statusConfig struct {
	store store
	key   string
	kind  distlock.Kind // KindMutex, KindSemaphore, or KindWrite for the read/write lock
	limit int           // KindSemaphore: --limit, which names the semaphore as run's does
	json  bool
}

// parseStatus parses the arguments of `distlock status`. All its errors
// mean exit status 2; it does no I/O.
func parseStatus(args []string, getenv func(string) string) (*statusConfig, error) {
	fs := newFlagSet("status")
	storeURL := fs.String("store", "", "")
	asJSON := fs.Bool("json", false, "")
	limit := fs.Int("limit", 0, "")
	shared := fs.Bool("shared", false, "")
	exclusive := fs.Bool("exclusive", false, "")
	if err := parseFlags(fs, args); err != nil {
		return nil, err
	}
	switch rest := fs.Args(); {
	case len(rest) == 0:
		return nil, usageErrorf("status: missing KEY")
	case len(rest) > 1:
		return nil, usageErrorf("status: %q after KEY: status takes one KEY, flags before it", rest[1])
	case rest[0] == "":
		return nil, usageErrorf("status: empty KEY")
	}
	cfg := &statusConfig{key: fs.Arg(0), json: *asJSON}
	var err error
	if cfg.kind, cfg.limit, err = kindFlags(fs, "status", *limit, *shared, *exclusive); err != nil {
		return nil, err
	}
	if cfg.kind == distlock.KindRead { // --shared and --exclusive name one read/write lock
		cfg.kind = distlock.KindWrite
	}
	if cfg.store, err = storeFrom(*storeURL, getenv); err != nil {
		return nil, err
	}
	if err := cfg.store.validateKey(cfg.key); err != nil {
		return nil, fmt.Errorf("status: KEY %s: %w", quoteKey(cfg.key), err)
	}
	if err := supports(cfg.store, cfg.kind, true); err != nil {
		return nil, fmt.Errorf("status: %w", err)
	}
	return cfg, nil
}

// kindFlags reads the kind of lock from --limit, --shared and --exclusive,
// which exclude each other: the mutex when none is given.
func kindFlags(fs *flag.FlagSet, cmd string, limit int, shared, exclusive bool) (distlock.Kind, int, error) {
	semaphore := isSet(fs, "limit")
	modes := 0
	for _, on := range []bool{semaphore, shared, exclusive} {
		if on {
			modes++
		}
	}
	switch {
	case modes > 1:
		return 0, 0, usageErrorf("%s: --limit, --shared and --exclusive exclude each other", cmd)
	case semaphore && limit < 1:
		return 0, 0, usageErrorf("%s: --limit %d: want 1 or more", cmd, limit)
	case semaphore:
		return distlock.KindSemaphore, limit, nil
	case shared:
		return distlock.KindRead, 0, nil
	case exclusive:
		return distlock.KindWrite, 0, nil
	}
	return distlock.KindMutex, 0, nil
}

// kindFlag names the flag that asked for kind, for messages.
func kindFlag(kind distlock.Kind) string {
	switch kind {
	case distlock.KindSemaphore:
		return "--limit"
	case distlock.KindRead:
		return "--shared"
	case distlock.KindWrite:
		return "--exclusive"
	}
	return "the mutex"
}

// storeFrom parses --store, or DISTLOCK_STORE when it is not given.
func storeFrom(flagValue string, getenv func(string) string) (store, error) {
	raw := flagValue
	if raw == "" {
		raw = getenv("DISTLOCK_STORE")
	}
	if raw == "" {
		return nil, usageErrorf("no store: give --store URL or set DISTLOCK_STORE")
	}
	return parseStore(raw)
}

// quoteKey quotes a key for a message, cut short when long.
func quoteKey(key string) string {
	const max = 64
	if len(key) <= max {
		return strconv.Quote(key)
	}
	return fmt.Sprintf("%q... (%d bytes)", key[:max], len(key))
}

func newFlagSet(name string) *flag.FlagSet {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(io.Discard) // distlock prints its own messages
	fs.Usage = func() {}
	return fs
}

// parseFlags parses args into fs, turning the flag package's errors into
// usage errors.
func parseFlags(fs *flag.FlagSet, args []string) error {
	err := fs.Parse(args)
	switch {
	case err == nil:
		return nil
	case errors.Is(err, flag.ErrHelp):
		return errHelp
	}
	return usageErrorf("%s: %v", fs.Name(), err)
}

func isSet(fs *flag.FlagSet, name string) bool {
	set := false
	fs.Visit(func(f *flag.Flag) { set = set || f.Name == name })
	return set
}

// durationFlag is a flag.Value for a duration >= 0: a number of seconds
// (as flock and timeout take) or a Go duration.
type durationFlag struct {
	d   time.Duration
	s   string
	set bool
}

func (f *durationFlag) String() string { return f.s }

func (f *durationFlag) Set(s string) error {
	d, err := parseDuration(s)
	if err != nil {
		return err
	}
	if d < 0 {
		return fmt.Errorf("negative duration %q", s)
	}
	f.d, f.s, f.set = d, s, true
	return nil
}

// parseDuration parses a number of seconds ("10", "1.5") or a Go duration
// ("1m30s", "250ms").
func parseDuration(s string) (time.Duration, error) {
	if secs, err := strconv.ParseFloat(s, 64); err == nil {
		if math.IsNaN(secs) || math.IsInf(secs, 0) || math.Abs(secs) > float64(math.MaxInt64/int64(time.Second)) {
			return 0, fmt.Errorf("bad duration %q", s)
		}
		return time.Duration(secs * float64(time.Second)), nil
	}
	d, err := time.ParseDuration(s)
	if err != nil {
		return 0, fmt.Errorf("bad duration %q: want seconds (1.5) or a Go duration (1m30s)", s)
	}
	return d, nil
}
