//go:build unix

// Command distlock runs a program while holding a distributed lock, from a
// shell or cron, on any store distlock speaks: Redis (standalone,
// Sentinel, Cluster), Redlock, etcd, ZooKeeper, PostgreSQL and
// MySQL/MariaDB.
//
//	distlock run --store redis://127.0.0.1:6379 --wait 0 nightly-report -- ./report.sh
//
// It acquires the key, runs the command with the lock's fencing token in
// its environment (DISTLOCK_TOKEN), renews the lock while the command
// runs, and releases it when the command exits, exiting with its status.
// When the lock is lost the command is stopped (SIGTERM, then SIGKILL) and
// distlock exits with a status of its own. With --limit N the command runs
// under a permit of the semaphore KEY (at most N runs at once), with
// --shared or --exclusive under the read or write side of the read/write
// lock KEY.
//
//	distlock status --store redis://127.0.0.1:6379 --json nightly-report
//
// prints who holds a lock (each grant is labelled with distlock's
// HOST:PID), its tokens and time left, and exits 0 when it is held, 1 when
// free. `distlock --help` lists the flags, the store URLs and the exit
// statuses; the README has a cron example.
//
// Install it from a clone of the repository (the modules are not
// published yet; see the README's "Install"):
//
//	go install ./cmd/distlock
//
// It runs on Linux and the other Unix systems (it needs process groups and
// signals).
package main

import (
	"errors"
	"fmt"
	"io"
	"os"
	"runtime/debug"
)

// Exit statuses of distlock's own; otherwise run exits with the command's.
// The help text and the README list them: keep the three together.
const (
	// exitUsage: bad usage, flag, key or store URL, or a kind of lock (or
	// an inspection) the store cannot do: nothing was sent to the store.
	// Also a --limit that differs from the semaphore's holders' (the store
	// said so; nothing was written).
	exitUsage = 2
	// exitUnavailable: the store could not be reached, or failed, before
	// the command started (sysexits' EX_UNAVAILABLE).
	exitUnavailable = 69
	// exitNotAcquired: another owner held the key for the whole wait
	// (sysexits' EX_TEMPFAIL); --conflict-exit-code changes it.
	exitNotAcquired = 75
	// exitFree: `distlock status` found the lock free (0: held).
	exitFree = 1
	// exitLost: the lock was lost while the command ran; the command was
	// stopped.
	exitLost = 79
	// exitCannotRun: the command was found but could not be started
	// (as sh, env and timeout do).
	exitCannotRun = 126
	// exitNotFound: the command was not found (as sh, env and timeout do).
	exitNotFound = 127
)

func main() {
	os.Exit(mainStatus(os.Args[1:], os.Getenv, os.Stdout, os.Stderr))
}

// mainStatus runs the command line args and returns the exit status.
func mainStatus(args []string, getenv func(string) string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		fmt.Fprint(stderr, shortUsage)
		return exitUsage
	}
	var err error
	switch args[0] {
	case "run":
		var cfg *runConfig
		if cfg, err = parseRun(args[1:], getenv); err == nil {
			return runCommand(cfg, stdout, stderr)
		}
	case "status":
		var cfg *statusConfig
		if cfg, err = parseStatus(args[1:], getenv); err == nil {
			return statusCommand(cfg, stdout, stderr)
		}
	case "help", "-h", "-help", "--help":
		fmt.Fprint(stdout, usage)
		return 0
	case "version", "-version", "--version":
		fmt.Fprintln(stdout, versionText())
		return 0
	default:
		err = usageErrorf("unknown command %q", args[0])
	}
	if errors.Is(err, errHelp) {
		fmt.Fprint(stdout, usage)
		return 0
	}
	fmt.Fprint(stderr, line("%v", err))
	var ue *usageError
	if errors.As(err, &ue) {
		fmt.Fprint(stderr, shortUsage)
	}
	var ee *exitError
	if errors.As(err, &ee) {
		return ee.code
	}
	return exitUsage
}

// exitError is an error with an exit status other than exitUsage.
type exitError struct {
	code int
	err  error
}

func (e *exitError) Error() string { return e.err.Error() }

func (e *exitError) Unwrap() error { return e.err }

// errHelp is returned by the parsers for -h and --help.
var errHelp = errors.New("help requested")

// usageError is a mistake on the command line: distlock prints the short
// usage after it.
type usageError struct{ msg string }

func (e *usageError) Error() string { return e.msg }

func usageErrorf(format string, args ...any) error {
	return &usageError{msg: fmt.Sprintf(format, args...)}
}

// versionText is what --version prints: the module's version (a tag once
// released, "(devel)" when built from a checkout), with the commit it was
// built from when the build knows it, and the Go version.
func versionText() string {
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return "distlock (unknown version)"
	}
	v := bi.Main.Version
	var rev, modified string
	for _, s := range bi.Settings {
		switch s.Key {
		case "vcs.revision":
			rev = s.Value
		case "vcs.modified":
			if s.Value == "true" {
				modified = ", modified"
			}
		}
	}
	if len(rev) > 12 {
		rev = rev[:12]
	}
	if rev != "" {
		v += " (" + rev + modified + ")"
	}
	return "distlock " + v + " " + bi.GoVersion
}
