//go:build unix

package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"os/signal"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/distlock/distlock"
	"github.com/distlock/distlock/backend"
)

// forwarded are the signals distlock passes to COMMAND's process group.
// The first four also end a wait for the lock.
var forwarded = []os.Signal{syscall.SIGINT, syscall.SIGTERM, syscall.SIGHUP, syscall.SIGQUIT, syscall.SIGUSR1, syscall.SIGUSR2}

// releaseTimeout bounds the release after COMMAND exited, and then
// distlock's Close (which retries a release that failed): distlock exits
// within twice this even when the store stopped answering.
const releaseTimeout = 5 * time.Second

// setupTimeout bounds connecting to the store (each client's own dial
// timeouts apply within it).
const setupTimeout = 30 * time.Second

// oneAttemptSetup bounds connecting to the store for one attempt (-n,
// --wait 0): as the attempt itself is bounded by a second, so is the
// setup, and a store that does not answer is reported within about two
// seconds, not after the clients' own timeouts.
const oneAttemptSetup = time.Second

// runner is one `distlock run`.
type runner struct {
	cfg    *runConfig
	stdout io.Writer
	stderr io.Writer
	// releaseFailed: the release after COMMAND failed and said so; Close,
	// which tries it again, need not say it twice.
	releaseFailed bool
}

// say writes a line on stderr.
func (r *runner) say(format string, args ...any) {
	fmt.Fprint(r.stderr, line(format, args...))
}

// line is a line of distlock's on stderr: "distlock: " and the message,
// whose own "distlock: " prefix, if any (an error of the library's), is
// not repeated.
func line(format string, args ...any) string {
	return "distlock: " + strings.TrimPrefix(fmt.Sprintf(format, args...), "distlock: ") + "\n"
}

// sayV writes a line on stderr with -v.
func (r *runner) sayV(format string, args ...any) {
	if r.cfg.verbose {
		r.say(format, args...)
	}
}

// signalError is the cause of the acquisition's context when a signal
// ended the wait.
type signalError struct{ sig syscall.Signal }

func (e signalError) Error() string { return "interrupted by " + e.sig.String() }

// runCommand acquires the lock, runs COMMAND under it and returns the exit
// status.
func runCommand(cfg *runConfig, stdout, stderr io.Writer) int {
	r := &runner{cfg: cfg, stdout: stdout, stderr: stderr}
	key := quoteKey(cfg.key)
	// Caught until distlock exits: once COMMAND has exited they are
	// dropped, so that the release runs to its end and distlock exits
	// with COMMAND's status.
	sigs := make(chan os.Signal, 16)
	signal.Notify(sigs, forwarded...)

	// Until COMMAND starts, a signal ends the wait for the lock.
	ctx, interrupt := context.WithCancelCause(context.Background())
	defer interrupt(nil)
	stopWatching := watch(sigs, interrupt)
	interrupted := func() (int, bool) {
		var se signalError
		if errors.As(context.Cause(ctx), &se) {
			r.sayV("%v while waiting for %s", se.sig, key)
			return 128 + int(se.sig), true
		}
		return 0, false
	}

	setup := setupTimeout
	if cfg.wait == 0 {
		setup = oneAttemptSetup
	}
	octx, cancel := context.WithTimeout(ctx, setup)
	res, closeClients, err := cfg.store.Open(octx, cfg.ttl)
	cancel()
	if err != nil {
		stopWatching()
		if code, ok := interrupted(); ok {
			return code
		}
		if cfg.wait == 0 && errors.Is(err, context.DeadlineExceeded) {
			err = fmt.Errorf("%w (one attempt: the store had %v to answer)", err, oneAttemptSetup)
		}
		r.say("store %s: %v", cfg.store, err)
		if errors.Is(err, distlock.ErrInvalid) { // --table, found bad before any I/O
			return exitUsage
		}
		return exitUnavailable
	}
	defer closeClients()
	note := &lossNote{}
	d, err := distlock.New(observe(res, note, r.sayV), distlock.WithAutoRenew(), distlock.WithDefaultTTL(cfg.ttl),
		distlock.WithHandlers(note), distlock.WithCloseTimeout(releaseTimeout), distlock.WithLabel(cfg.label))
	if err != nil {
		stopWatching()
		if c, ok := res.(io.Closer); ok {
			c.Close()
		}
		r.say("store %s: %v", cfg.store, err)
		return exitUnavailable
	}
	defer func() {
		// After a release that failed and said so, Close (which tries it
		// again) has nothing new to say: it would say it twice.
		if err := d.Close(); err != nil && !r.releaseFailed {
			r.say("%v", err)
		}
	}()

	what := lockText(cfg.key, cfg.kind, cfg.limit)
	r.sayV("waiting for %s on %s (%s)", what, cfg.store, waitText(cfg.wait))
	lk, err := acquire(ctx, d, cfg)
	stopWatching()
	if code, ok := interrupted(); ok {
		if lk != nil { // acquired as the signal came: give it back
			r.release(lk, false)
		}
		return code
	}
	switch {
	case errors.Is(err, distlock.ErrInvalid):
		r.say("%v", err)
		return exitUsage
	case errors.Is(err, distlock.ErrUnsupported):
		// supports checked it before connecting; a store may still
		// refuse a kind only once open (it did not say so then).
		r.say("%s: the store %s cannot hold it: %v", kindFlag(cfg.kind), cfg.store, err)
		return exitUsage
	case errors.Is(err, distlock.ErrLimitMismatch):
		r.say("--limit %d: the holders of the semaphore %s took it with another limit (distlock status shows it); every run of one semaphore must give the same --limit: %v",
			cfg.limit, key, err)
		return exitUsage
	case errors.Is(err, distlock.ErrNotAcquired):
		r.sayV("%s is held by another owner: not acquired (%s)", what, waitText(cfg.wait))
		return cfg.conflict
	case err != nil:
		r.say("acquiring %s on %s: %v", what, cfg.store, err)
		return exitUnavailable
	}
	r.sayV("acquired %s with token %d (it holds %s)", what, lk.Token(), cfg.store.Holds(cfg.ttl))
	if cfg.argv == nil {
		return r.hold(lk, note, sigs)
	}
	return r.child(lk, note, sigs)
}

// hold keeps lk, renewed, until a signal (SIGINT, SIGTERM, SIGHUP or
// SIGQUIT) asks distlock to let go, as etcdctl lock does without a
// command: it prints the lock's environment on stdout (for a script that
// started distlock in the background), releases lk on the signal and
// returns 0, or exitLost when the lock was lost first.
func (r *runner) hold(lk *distlock.Lock, note *lossNote, sigs <-chan os.Signal) int {
	fmt.Fprintf(r.stdout, "DISTLOCK_KEY=%s\nDISTLOCK_TOKEN=%d\n", shellQuote(r.cfg.key), lk.Token())
	for _, kv := range electionEnv(r.cfg, lk) {
		k, v, _ := strings.Cut(kv, "=")
		fmt.Fprintf(r.stdout, "%s=%s\n", k, shellQuote(v))
	}
	r.sayV("holding %s until SIGINT or SIGTERM", quoteKey(r.cfg.key))
	for {
		select {
		case s := <-sigs:
			switch s {
			case syscall.SIGINT, syscall.SIGTERM, syscall.SIGHUP, syscall.SIGQUIT:
				r.sayV("%v: releasing %s", s, quoteKey(r.cfg.key))
				if !r.release(lk, false) {
					return exitLost
				}
				return 0
			}
		case <-lk.Done():
			r.say("lost %s: %v", quoteKey(r.cfg.key), note.get())
			r.release(lk, true)
			return exitLost
		}
	}
}

// shellQuote quotes s for a POSIX shell, unless it needs no quoting.
func shellQuote(s string) string {
	if s != "" && strings.Trim(s, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-.,:/@%+=") == "" {
		return s
	}
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}

// acquire takes the lock of cfg's kind: the mutex, a permit of the
// semaphore, or a side of the read/write lock.
func acquire(ctx context.Context, d *distlock.DistributeLock, cfg *runConfig) (*distlock.Lock, error) {
	switch cfg.kind {
	case distlock.KindSemaphore:
		return d.Semaphore(cfg.key, cfg.limit).TryAcquire(ctx, cfg.wait)
	case distlock.KindRead:
		return d.RWMutex(cfg.key).TryRLock(ctx, cfg.wait)
	case distlock.KindWrite:
		return d.RWMutex(cfg.key).TryLock(ctx, cfg.wait)
	case distlock.KindElection:
		return campaign(ctx, d, cfg)
	}
	return d.TryLock(ctx, cfg.key, cfg.wait)
}

// lockText names the lock for messages: the quoted key, and its kind
// unless it is the mutex.
func lockText(key string, kind distlock.Kind, limit int) string {
	switch kind {
	case distlock.KindSemaphore:
		return fmt.Sprintf("%s (a permit of the semaphore of %d)", quoteKey(key), limit)
	case distlock.KindRead:
		return quoteKey(key) + " (the read side of the read/write lock)"
	case distlock.KindWrite:
		return quoteKey(key) + " (the write side of the read/write lock)"
	case distlock.KindElection:
		return "the leadership of the election " + quoteKey(key)
	}
	return quoteKey(key)
}

// watch turns the first terminating signal on sigs into the end of the
// acquisition, until the returned function is called (it returns once the
// watching stopped).
func watch(sigs <-chan os.Signal, interrupt context.CancelCauseFunc) func() {
	stop, stopped := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(stopped)
		for {
			select {
			case s := <-sigs:
				switch s {
				case syscall.SIGINT, syscall.SIGTERM, syscall.SIGHUP, syscall.SIGQUIT:
					interrupt(signalError{s.(syscall.Signal)})
					return
				}
			case <-stop:
				return
			}
		}
	}()
	return func() { close(stop); <-stopped }
}

func waitText(wait time.Duration) string {
	switch wait {
	case 0:
		return "one attempt"
	case distlock.WaitForever:
		return "until acquired"
	}
	return "waiting up to " + wait.String()
}

// child runs COMMAND while lk is held, and releases lk when it exits.
func (r *runner) child(lk *distlock.Lock, note *lossNote, sigs <-chan os.Signal) int {
	cfg := r.cfg
	key := quoteKey(cfg.key)
	cmd := exec.Command(cfg.path)
	cmd.Args = cfg.argv
	cmd.Stdin, cmd.Stdout, cmd.Stderr = os.Stdin, os.Stdout, os.Stderr
	cmd.Env = append(os.Environ(), "DISTLOCK_KEY="+cfg.key, "DISTLOCK_TOKEN="+strconv.FormatUint(lk.Token(), 10))
	cmd.Env = append(cmd.Env, electionEnv(cfg, lk)...)
	fg := inForeground()
	cmd.SysProcAttr = procAttr(fg)

	// COMMAND is started, and waited for, on one locked thread: the
	// parent-death signal (Linux) fires when the thread that forked it
	// ends, and a locked thread ends only with its goroutine.
	started := make(chan error, 1)
	exited := make(chan struct{})
	go func() {
		runtime.LockOSThread()
		if err := cmd.Start(); err != nil {
			started <- err
			return
		}
		started <- nil
		_ = cmd.Wait() // its status is in cmd.ProcessState
		close(exited)
	}()
	if err := <-started; err != nil {
		if fg { // the child took the foreground before its exec failed
			takeForeground()
		}
		r.say("starting %s: %v", cfg.argv[0], err)
		r.release(lk, false)
		if errors.Is(err, fs.ErrNotExist) {
			return exitNotFound
		}
		return exitCannotRun
	}
	pgid := cmd.Process.Pid

	done := lk.Done()
	lost := false
	stop := func(why string) {
		done, lost = nil, true
		r.say("lost %s: %s; sending SIGTERM to the command, SIGKILL in %v", key, why, cfg.grace)
		_ = syscall.Kill(-pgid, syscall.SIGTERM)
	}
	// The lock is taken as lost a margin before its validity ends when
	// renewals failed until then: COMMAND must get the signal before the
	// store can hand KEY to another holder, and a process needs longer
	// than the facade's allowance (Done) to hear of it.
	margin := lossMargin(cfg.ttl)
	expiring := time.NewTimer(time.Until(lk.Deadline()) - margin)
	defer expiring.Stop()
	var kill <-chan time.Time
	for running := true; running; {
		select {
		case s := <-sigs:
			r.sayV("passing %v to the command", s)
			_ = syscall.Kill(-pgid, s.(syscall.Signal))
		case <-expiring.C:
			dl := lk.Deadline()
			if dl.IsZero() || done == nil { // lost already: Done says why
				continue
			}
			if left := time.Until(dl) - margin; left > 0 { // renewed meanwhile
				expiring.Reset(left)
				continue
			}
			stop(fmt.Sprintf("renewals failed until %v before its TTL ran out: %v", margin, note.lastRenewal()))
			kill = time.After(cfg.grace)
		case <-done:
			stop(fmt.Sprint(note.get()))
			kill = time.After(cfg.grace)
		case <-kill:
			kill = nil
			r.say("the command outlived --grace (%v): SIGKILL", cfg.grace)
			_ = syscall.Kill(-pgid, syscall.SIGKILL)
		case <-exited:
			running = false
		}
	}
	if fg {
		takeForeground()
	}
	if !lost && isClosed(lk.Done()) { // lost as the command exited
		lost = true
		r.say("lost %s as the command exited: %v", key, note.get())
	}
	if lost { // what is left of its process group goes too
		_ = syscall.Kill(-pgid, syscall.SIGKILL)
	}
	status := exitStatus(cmd.ProcessState)
	r.sayV("the command exited with status %d", status)
	if !r.release(lk, lost) {
		lost = true
	}
	if lost {
		return exitLost
	}
	return status
}

// release unlocks lk, bounded by releaseTimeout. It returns false when the
// store no longer held the lock (and lost was not known): another owner
// may have held it while COMMAND ran.
func (r *runner) release(lk *distlock.Lock, lost bool) bool {
	key := quoteKey(r.cfg.key)
	ctx, cancel := context.WithTimeout(context.Background(), releaseTimeout)
	defer cancel()
	err := lk.Unlock(ctx)
	switch {
	case err == nil:
		r.sayV("released %s", key)
	case errors.Is(err, distlock.ErrNotHeld):
		if !lost {
			r.say("%s was not held any more when the command exited: %v", key, err)
			return false
		}
	default:
		r.releaseFailed = true
		r.say("releasing %s: %v; the store frees it when its TTL (%v) runs out", key, err, r.cfg.ttl)
	}
	return true
}

// holderLabel is the label stored with distlock's grants, which `distlock
// status` shows: HOST:PID, the host name cut short to fit the store's
// bound on labels.
func holderLabel() string {
	host, err := os.Hostname()
	if err != nil || host == "" {
		host = "unknown-host"
	}
	pid := ":" + strconv.Itoa(os.Getpid())
	if len(host)+len(pid) > backend.MaxLabelLen {
		host = host[:backend.MaxLabelLen-len(pid)]
	}
	return host + pid
}

// lossMargin is how long before the lock's validity ends distlock stops
// COMMAND if renewals failed until then: a twentieth of the TTL, between
// 10ms and 1s, and at most half the TTL.
func lossMargin(ttl time.Duration) time.Duration {
	return min(max(ttl/20, 10*time.Millisecond), time.Second, ttl/2)
}

// exitStatus is the shell's status for a process state: its exit code,
// or 128+N when signal N ended it.
func exitStatus(ps *os.ProcessState) int {
	if ws, ok := ps.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
		return 128 + int(ws.Signal())
	}
	return ps.ExitCode()
}

// isClosed reports whether ch is closed.
func isClosed(ch <-chan struct{}) bool {
	select {
	case <-ch:
		return true
	default:
		return false
	}
}

// lookPath finds COMMAND as the shell would, before anything touches the
// store: 127 when it is not found, 126 when it cannot be run.
func lookPath(name string) (string, error) {
	path, err := exec.LookPath(name)
	switch {
	case err == nil:
		return path, nil
	case errors.Is(err, exec.ErrNotFound), errors.Is(err, fs.ErrNotExist):
		return "", &exitError{code: exitNotFound, err: fmt.Errorf("run: %w", err)}
	}
	return "", &exitError{code: exitCannotRun, err: fmt.Errorf("run: %w", err)}
}
