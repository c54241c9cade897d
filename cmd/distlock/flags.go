//go:build unix

package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"strconv"
	"strings"
	"time"

	"github.com/distlock/distlock"
	"github.com/distlock/distlock/backend"
	"github.com/distlock/distlock/internal/stores"
)

// runConfig is a parsed `distlock run` command line.
type runConfig struct {
	store    store
	key      string
	argv     []string      // COMMAND and its ARGS; nil: hold KEY until a signal
	path     string        // COMMAND found in PATH
	wait     time.Duration // distlock.WaitForever unless --wait was given
	ttl      time.Duration
	grace    time.Duration
	conflict int
	verbose  bool
	kind     distlock.Kind // KindMutex, or KindSemaphore (--limit), KindRead (--shared), KindWrite (--exclusive), KindElection (--elect)
	limit    int           // KindSemaphore: --limit
	label    string        // stored with the grant: --label, or HOST:PID
	value    string        // KindElection: --value, the value the leader publishes
}

// Defaults and bounds of run's flags: the help text says them too.
const (
	defaultTTL   = 10 * time.Second
	defaultGrace = 5 * time.Second
	// minTTL is the shortest --ttl: the lock is renewed every third of
	// its TTL, and a renewal must reach the store and come back, on a
	// busy machine, well within that (a TTL of 10ms was lost and renewed
	// in turns on a healthy Redis).
	minTTL = 500 * time.Millisecond
)

// parseRun parses the arguments of `distlock run`. All its errors mean
// exit status 2; it does no I/O but looking COMMAND up in PATH.
func parseRun(args []string, getenv func(string) string) (*runConfig, error) {
	fs := newFlagSet("run")
	storeURL := fs.String("store", "", "")
	var so storeOptions
	fs.StringVar(&so.Prefix, "prefix", "", "")
	fs.StringVar(&so.Table, "table", "", "")
	var wait, ttl, grace durationFlag
	fs.Var(&wait, "wait", "")
	fs.Var(&wait, "w", "")
	nonblock := fs.Bool("n", false, "")
	fs.Var(&ttl, "ttl", "")
	fs.Var(&grace, "grace", "")
	var conflict int
	fs.IntVar(&conflict, "conflict-exit-code", exitNotAcquired, "")
	fs.IntVar(&conflict, "E", exitNotAcquired, "")
	limit := fs.Int("limit", 0, "")
	var shared, exclusive, verbose bool
	fs.BoolVar(&shared, "shared", false, "")
	fs.BoolVar(&shared, "s", false, "")
	fs.BoolVar(&exclusive, "exclusive", false, "")
	fs.BoolVar(&exclusive, "x", false, "")
	fs.BoolVar(&verbose, "v", false, "")
	fs.BoolVar(&verbose, "verbose", false, "")
	var shell string
	fs.StringVar(&shell, "c", "", "")
	fs.StringVar(&shell, "shell", "", "")
	label := fs.String("label", "", "")
	elect := fs.Bool("elect", false, "")
	value := fs.String("value", "", "")
	err := parseFlags(fs, args)
	if err != nil {
		return nil, err
	}
	for _, pair := range [][2]string{{"wait", "w"}, {"wait", "n"}, {"w", "n"}, {"conflict-exit-code", "E"},
		{"shared", "s"}, {"exclusive", "x"}, {"c", "shell"}} {
		if isSet(fs, pair[0]) && isSet(fs, pair[1]) {
			return nil, usageErrorf("run: %s and %s say the same thing: give one", flagName(pair[0]), flagName(pair[1]))
		}
	}
	byShell := isSet(fs, "c") || isSet(fs, "shell")
	if byShell && shell == "" {
		return nil, usageErrorf("run: %s: an empty command string", flagName(setOf(fs, "c", "shell")))
	}
	// KEY, then nothing (hold KEY until a signal, or run -c's string), or
	// -- and COMMAND. Anything else before -- is a mistake: a second KEY
	// or a COMMAND without -- would otherwise run as the wrong program.
	rest := fs.Args()
	if len(rest) == 0 {
		return nil, usageErrorf("run: missing KEY")
	}
	// Without --wait, until acquired or interrupted (a signal ends the
	// acquisition's context).
	cfg := &runConfig{key: rest[0], wait: distlock.WaitForever, ttl: defaultTTL, grace: defaultGrace,
		conflict: conflict, verbose: verbose}
	rest = rest[1:]
	switch {
	case len(rest) == 0:
	case rest[0] == "--":
		if len(rest) == 1 {
			return nil, usageErrorf("run: missing COMMAND after --")
		}
		if byShell {
			return nil, usageErrorf("run: %s and a COMMAND after -- exclude each other", flagName(setOf(fs, "c", "shell")))
		}
		cfg.argv = rest[1:]
	case strings.HasPrefix(rest[0], "-"):
		return nil, usageErrorf("run: %s after KEY: flags go before KEY, COMMAND after --", rest[0])
	default:
		return nil, usageErrorf("run: %q after KEY %q: one KEY, then -- and COMMAND (distlock run [flags] KEY -- COMMAND)", rest[0], cfg.key)
	}
	if byShell {
		sh := getenv("SHELL")
		if sh == "" {
			sh = "/bin/sh"
		}
		cfg.argv = []string{sh, "-c", shell}
	}
	if cfg.key == "" {
		return nil, usageErrorf("run: empty KEY")
	}
	switch {
	case *nonblock:
		cfg.wait = 0
	case wait.set:
		cfg.wait = wait.d
	}
	if ttl.set {
		switch {
		case ttl.d <= 0:
			return nil, usageErrorf("run: --ttl %s: want a duration > 0", ttl.s)
		case ttl.d < minTTL:
			return nil, usageErrorf("run: --ttl %s is below the minimum, %v: the lock is renewed every third of its TTL, and each renewal must reach the store and come back well within that", ttl.s, minTTL)
		}
		cfg.ttl = ttl.d
	}
	if grace.set {
		cfg.grace = grace.d
	}
	if conflict < 0 || conflict > 255 {
		return nil, usageErrorf("run: %s %d: want 0 to 255", flagName(setOf(fs, "conflict-exit-code", "E")), conflict)
	}
	cfg.label = holderLabel()
	if isSet(fs, "label") {
		if len(*label) > backend.MaxLabelLen {
			return nil, usageErrorf("run: --label of %d bytes: at most %d", len(*label), backend.MaxLabelLen)
		}
		cfg.label = *label
	}
	if cfg.kind, cfg.limit, err = kindFlags(fs, "run", *limit, shared, exclusive, *elect); err != nil {
		return nil, err
	}
	if err := electFlags(fs, cfg, *value); err != nil {
		return nil, err
	}
	so.PrefixSet, so.TableSet = isSet(fs, "prefix"), isSet(fs, "table")
	s, err := storeFrom(*storeURL, so, getenv)
	if err != nil {
		return nil, err
	}
	cfg.store = s
	if err := s.ValidateKey(storeKey(cfg.key, cfg.kind)); err != nil {
		return nil, fmt.Errorf("run: KEY %s: %w", quoteKey(cfg.key), err)
	}
	if err := supports(s, cfg.kind, false); err != nil {
		return nil, fmt.Errorf("run: %s: %w", kindFlag(cfg.kind), err)
	}
	if cfg.argv != nil {
		if cfg.path, err = lookPath(cfg.argv[0]); err != nil {
			return nil, err
		}
	}
	return cfg, nil
}

// flagName is a flag's name as the help spells it: -n, --wait.
func flagName(name string) string {
	if len(name) == 1 {
		return "-" + name
	}
	return "--" + name
}

// setOf returns the one of names that was given, or the first.
func setOf(fs *flag.FlagSet, names ...string) string {
	for _, n := range names {
		if isSet(fs, n) {
			return n
		}
	}
	return names[0]
}

// statusConfig is a parsed `distlock status` command line.
type statusConfig struct {
	store store
	key   string
	kind  distlock.Kind // KindMutex, KindSemaphore, KindWrite for the read/write lock, or KindElection
	limit int           // KindSemaphore: --limit, which names the semaphore as run's does
	json  bool
}

// parseStatus parses the arguments of `distlock status`. All its errors
// mean exit status 2; it does no I/O.
func parseStatus(args []string, getenv func(string) string) (*statusConfig, error) {
	fs := newFlagSet("status")
	storeURL := fs.String("store", "", "")
	var so storeOptions
	fs.StringVar(&so.Prefix, "prefix", "", "")
	fs.StringVar(&so.Table, "table", "", "")
	asJSON := fs.Bool("json", false, "")
	limit := fs.Int("limit", 0, "")
	var shared, exclusive bool
	fs.BoolVar(&shared, "shared", false, "")
	fs.BoolVar(&shared, "s", false, "")
	fs.BoolVar(&exclusive, "exclusive", false, "")
	fs.BoolVar(&exclusive, "x", false, "")
	elect := fs.Bool("elect", false, "")
	if err := parseFlags(fs, args); err != nil {
		return nil, err
	}
	so.PrefixSet, so.TableSet = isSet(fs, "prefix"), isSet(fs, "table")
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
	if cfg.kind, cfg.limit, err = kindFlags(fs, "status", *limit, shared, exclusive, *elect); err != nil {
		return nil, err
	}
	if cfg.kind == distlock.KindRead { // --shared and --exclusive name one read/write lock
		cfg.kind = distlock.KindWrite
	}
	if cfg.store, err = storeFrom(*storeURL, so, getenv); err != nil {
		return nil, err
	}
	if err := cfg.store.ValidateKey(storeKey(cfg.key, cfg.kind)); err != nil {
		return nil, fmt.Errorf("status: KEY %s: %w", quoteKey(cfg.key), err)
	}
	if err := supports(cfg.store, cfg.kind, true); err != nil {
		return nil, fmt.Errorf("status: %w", err)
	}
	return cfg, nil
}

// kindFlags reads the kind of lock from --limit, --shared, --exclusive
// and --elect, which exclude each other: the mutex when none is given.
func kindFlags(fs *flag.FlagSet, cmd string, limit int, shared, exclusive, elect bool) (distlock.Kind, int, error) {
	semaphore := isSet(fs, "limit")
	modes := 0
	for _, on := range []bool{semaphore, shared, exclusive, elect} {
		if on {
			modes++
		}
	}
	switch {
	case modes > 1:
		return 0, 0, usageErrorf("%s: --limit, --shared, --exclusive and --elect exclude each other", cmd)
	case elect:
		return distlock.KindElection, 0, nil
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
	case distlock.KindElection:
		return "--elect"
	}
	return "the mutex"
}

// storeFrom parses --store, or DISTLOCK_STORE when it is not given, with
// the options --prefix and --table.
func storeFrom(flagValue string, o storeOptions, getenv func(string) string) (store, error) {
	raw := flagValue
	if raw == "" {
		raw = getenv("DISTLOCK_STORE")
	}
	if raw == "" {
		return nil, usageErrorf("no store: give --store URL or set DISTLOCK_STORE")
	}
	return parseStore(raw, o)
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
	d, err := stores.ParseDuration(s)
	if err != nil {
		return err
	}
	if d < 0 {
		return fmt.Errorf("negative duration %q", s)
	}
	f.d, f.s, f.set = d, s, true
	return nil
}
