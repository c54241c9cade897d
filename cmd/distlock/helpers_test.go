//go:build unix

package main

import (
	"bufio"
	"bytes"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// The end-to-end tests run the distlock binary, built once by TestMain
// (with -race when the tests run with it), with the test binary itself as
// COMMAND: started with DISTLOCK_TEST_CHILD set, it is the child program
// of childMain.
var (
	bin  string // the distlock binary
	self string // this test binary, the child program
)

// raceOptions shortens the race detector's wait at exit (1s by default)
// for distlock and the child, both built with -race when the tests are:
// time for reports, not for every run. A race report changes the exit
// status (66), which the tests check.
const raceOptions = "GORACE=atexit_sleep_ms=50"

// patience bounds every wait of a test for a process or a line: reaching
// it fails the test (nothing is timed by it).
const patience = 2 * time.Minute

func TestMain(m *testing.M) {
	if os.Getenv("DISTLOCK_TEST_CHILD") != "" {
		os.Exit(childMain(os.Args[1:]))
	}
	os.Exit(buildAndRun(m))
}

func buildAndRun(m *testing.M) int {
	dir, err := os.MkdirTemp("", "distlock-cmd-test-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer os.RemoveAll(dir)
	bin = filepath.Join(dir, "distlock")
	args := []string{"build", "-o", bin}
	if raceEnabled {
		args = append(args, "-race")
	}
	build := exec.Command("go", append(args, ".")...)
	if out, err := build.CombinedOutput(); err != nil {
		fmt.Fprintf(os.Stderr, "building distlock: %v\n%s", err, out)
		return 1
	}
	if self, err = os.Executable(); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	return m.Run()
}

// childMain is the child program. It appends lines to -file:
//
//	start KEY TOKEN PID PPID UNIXNANO  when it starts (PPID: distlock's)
//	signal NAME PID UNIXNANO        with -signals, for each SIGINT, SIGTERM, SIGHUP
//	                                or SIGUSR1 (NAME: INT, TERM, HUP, USR1), which
//	                                then do not end it
//	grandchild PID                  with -grandchild: a process it started in its group
//	end KEY TOKEN PID PPID UNIXNANO HOW  before it exits: HOW is "exit",
//	                                or with -die the signal (TERM, INT, HUP)
//	                                that ends it; the first of the two wins
//
// and holds for -hold (a duration, or "stdin": until its stdin ends), then
// exits with -exit (a negative -exit -N: killed by signal N).
func childMain(args []string) int {
	fs := flag.NewFlagSet("child", flag.ContinueOnError)
	file := fs.String("file", "", "")
	hold := fs.String("hold", "0", "")
	exit := fs.Int("exit", 0, "")
	signals := fs.Bool("signals", false, "")
	grandchild := fs.Bool("grandchild", false, "")
	die := fs.Bool("die", false, "")
	if err := fs.Parse(args); err != nil {
		return 100
	}
	f, err := os.OpenFile(*file, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o644)
	if err != nil && *file != "" {
		fmt.Fprintln(os.Stderr, err)
		return 100
	}
	note := func(format string, args ...any) {
		if f != nil {
			f.WriteString(fmt.Sprintf(format, args...) + "\n") // one write: O_APPEND keeps lines whole
		}
	}
	key, token, pid, ppid := os.Getenv("DISTLOCK_KEY"), os.Getenv("DISTLOCK_TOKEN"), os.Getpid(), os.Getppid()
	var endMu sync.Mutex
	ended := false
	end := func(how string) bool {
		endMu.Lock()
		defer endMu.Unlock()
		if ended {
			return false
		}
		ended = true
		note("end %s %s %d %d %d %s", key, token, pid, ppid, time.Now().UnixNano(), how)
		return true
	}
	if *die {
		ch := make(chan os.Signal, 1)
		names := map[os.Signal]string{syscall.SIGINT: "INT", syscall.SIGTERM: "TERM", syscall.SIGHUP: "HUP"}
		signal.Notify(ch, syscall.SIGTERM, syscall.SIGINT, syscall.SIGHUP)
		go func() {
			s := <-ch
			if end(names[s]) { // else it exits by itself, as recorded; later signals are dropped
				signal.Reset(s)
				syscall.Kill(pid, s.(syscall.Signal))
			}
		}()
	}
	if *signals {
		ch := make(chan os.Signal, 16)
		names := map[os.Signal]string{syscall.SIGINT: "INT", syscall.SIGTERM: "TERM", syscall.SIGHUP: "HUP", syscall.SIGUSR1: "USR1"}
		for s := range names {
			signal.Notify(ch, s)
		}
		go func() {
			for s := range ch {
				note("signal %s %d %d", names[s], pid, time.Now().UnixNano())
			}
		}()
	}
	note("start %s %s %d %d %d", key, token, pid, ppid, time.Now().UnixNano())
	if *grandchild {
		exe, err := os.Executable()
		if err != nil {
			return 100
		}
		gc := exec.Command(exe, "-hold", "1h")
		gc.Env = os.Environ()
		if err := gc.Start(); err != nil {
			return 100
		}
		note("grandchild %d", gc.Process.Pid)
	}
	if *hold == "stdin" {
		io.Copy(io.Discard, os.Stdin)
	} else if d, err := time.ParseDuration(*hold); err == nil {
		time.Sleep(d) // the work the lock protects
	}
	if !end("exit") {
		select {} // a signal ends it
	}
	if *exit < 0 {
		sig := syscall.Signal(-*exit)
		signal.Reset(sig)
		syscall.Kill(pid, sig)
		select {}
	}
	return *exit
}

// childCmd is the COMMAND part of a distlock command line: the child
// program with args.
func childCmd(args ...string) []string {
	return append([]string{"--", self}, args...)
}

// proc is a running distlock.
type proc struct {
	t      *testing.T
	cmd    *exec.Cmd
	stdin  io.WriteCloser
	lines  chan string // its stderr, line by line
	mu     sync.Mutex
	stderr bytes.Buffer
	stdout bytes.Buffer
	exited chan struct{}
	code   int
}

// start starts distlock with args; env is added to the test's
// environment, with DISTLOCK_TEST_CHILD (for the child program). It may be
// called from any goroutine: it reports errors with t.Errorf, and then
// returns a proc that has exited with status -2.
func start(t *testing.T, env []string, args ...string) *proc {
	t.Helper()
	p := &proc{t: t, lines: make(chan string, 1000), exited: make(chan struct{})}
	p.cmd = exec.Command(bin, args...)
	p.cmd.Env = append(append(os.Environ(), "DISTLOCK_TEST_CHILD=1", raceOptions), env...)
	p.cmd.Stdout = &lockedWriter{mu: &p.mu, w: &p.stdout}
	var err error
	p.stdin, err = p.cmd.StdinPipe()
	var stderr io.ReadCloser
	if err == nil {
		stderr, err = p.cmd.StderrPipe()
	}
	if err == nil {
		err = p.cmd.Start()
	}
	if err != nil {
		t.Errorf("starting distlock: %v", err)
		p.code = -2
		close(p.lines)
		close(p.exited)
		return p
	}
	go func() {
		sc := bufio.NewScanner(stderr)
		for sc.Scan() {
			p.mu.Lock()
			p.stderr.WriteString(sc.Text() + "\n")
			p.mu.Unlock()
			select {
			case p.lines <- sc.Text():
			default: // nobody reads lines: the buffer keeps them
			}
		}
		p.cmd.Wait()
		p.code = exitStatus(p.cmd.ProcessState) // 128+N if signal N ended it, as a shell says
		close(p.lines)
		close(p.exited)
	}()
	t.Cleanup(func() {
		select {
		case <-p.exited:
		default:
			p.cmd.Process.Kill()
			<-p.exited
		}
	})
	return p
}

type lockedWriter struct {
	mu *sync.Mutex
	w  io.Writer
}

func (w *lockedWriter) Write(b []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.w.Write(b)
}

// wait closes distlock's stdin (the child's, too), waits for it to exit
// and returns its exit status as a shell gives it (128+N: signal N ended
// it). It may be called from any goroutine.
func (p *proc) wait() int {
	p.t.Helper()
	if p.stdin != nil {
		p.stdin.Close()
	}
	select {
	case <-p.exited:
	case <-time.After(patience):
		p.t.Errorf("distlock %q still running after %v: killed; stderr:\n%s", p.cmd.Args[1:], patience, p.errText())
		p.cmd.Process.Kill()
		<-p.exited
	}
	return p.code
}

// waitLine waits for a line of stderr containing s and returns it.
func (p *proc) waitLine(s string) string {
	p.t.Helper()
	deadline := time.After(patience)
	for {
		select {
		case l, ok := <-p.lines:
			if !ok {
				p.t.Fatalf("distlock exited without saying %q; stderr:\n%s", s, p.errText())
			}
			if strings.Contains(l, s) {
				return l
			}
		case <-deadline:
			p.t.Fatalf("distlock did not say %q within %v; stderr:\n%s", s, patience, p.errText())
		}
	}
}

func (p *proc) errText() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.stderr.String()
}

// runDistlock runs distlock to the end and returns its status and stderr.
func runDistlock(t *testing.T, env []string, args ...string) (int, string) {
	t.Helper()
	p := start(t, env, args...)
	code := p.wait()
	return code, p.errText()
}

// record is a line of a child's file.
type record struct {
	event string // start, end, signal, grandchild
	key   string
	token uint64
	pid   int
	ppid  int    // start, end: the distlock that ran it
	at    int64  // unix nanoseconds
	how   string // end: "exit" or the signal that ended it
	name  string
}

// readRecords parses a child's file; a missing file has none.
func readRecords(t *testing.T, file string) []record {
	t.Helper()
	b, err := os.ReadFile(file)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		t.Fatal(err)
	}
	var rs []record
	for _, l := range strings.Split(strings.TrimSpace(string(b)), "\n") {
		if l == "" {
			continue
		}
		f := strings.Fields(l)
		r := record{event: f[0]}
		switch {
		case r.event == "start" && len(f) == 6, r.event == "end" && len(f) == 7:
			r.key = f[1]
			r.token, err = strconv.ParseUint(f[2], 10, 64)
			if err == nil {
				r.pid, err = strconv.Atoi(f[3])
			}
			if err == nil {
				r.ppid, err = strconv.Atoi(f[4])
			}
			if err == nil {
				r.at, err = strconv.ParseInt(f[5], 10, 64)
			}
			if r.event == "end" {
				r.how = f[6]
			}
		case r.event == "signal" && len(f) == 4:
			r.name = f[1]
			r.pid, err = strconv.Atoi(f[2])
			if err == nil {
				r.at, err = strconv.ParseInt(f[3], 10, 64)
			}
		case r.event == "grandchild" && len(f) == 2:
			r.pid, err = strconv.Atoi(f[1])
		default:
			err = errors.New("unknown line")
		}
		if err != nil {
			t.Fatalf("%s: line %q: %v", file, l, err)
		}
		rs = append(rs, r)
	}
	return rs
}

// waitRecord polls a child's file until it has a record of event.
func waitRecord(t *testing.T, file, event string) record {
	t.Helper()
	deadline := time.Now().Add(patience)
	for {
		for _, r := range readRecords(t, file) {
			if r.event == event {
				return r
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: no %q record within %v", file, event, patience)
		}
		time.Sleep(5 * time.Millisecond) // polling a file the child writes, with a deadline
	}
}

// alive reports whether pid runs (a zombie does not).
func alive(pid int) bool {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return syscall.Kill(pid, 0) == nil // not Linux: no zombie check
	}
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	return i < 0 || i+2 >= len(s) || s[i+2] != 'Z'
}

// waitGone polls until pid no longer runs.
func waitGone(t *testing.T, pid int, what string) {
	t.Helper()
	deadline := time.Now().Add(patience)
	for alive(pid) {
		if time.Now().After(deadline) {
			t.Fatalf("%s (pid %d) still runs after %v", what, pid, patience)
		}
		time.Sleep(5 * time.Millisecond) // polling the process table, with a deadline
	}
}

// uniqueKey is a key of its own for each test.
func uniqueKey(t *testing.T) string {
	return strings.NewReplacer("/", "-", " ", "_").Replace(t.Name()) + "-" + strconv.FormatInt(time.Now().UnixNano()%1e9, 36)
}

// listener is a TCP server that records who connects to it: a store URL
// pointing at it shows whether distlock touched the store.
type listener struct {
	net.Listener
	peers chan string // the remote address of each connection accepted
}

func listen(t *testing.T) *listener {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ln := &listener{Listener: l, peers: make(chan string, 1000)}
	t.Cleanup(func() { l.Close() })
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			ln.peers <- c.RemoteAddr().String()
			c.Close()
		}
	}()
	return ln
}

// connections returns how many connections were made to l before now. It
// connects itself and counts those accepted before its own: the backlog
// is accepted in order, so none made before is missed.
func (l *listener) connections(t *testing.T) int {
	t.Helper()
	c, err := net.Dial("tcp", l.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	me := c.LocalAddr().String()
	n := 0
	for {
		select {
		case p := <-l.peers:
			if p == me {
				return n
			}
			n++
		case <-time.After(patience):
			t.Fatalf("listener did not accept its own connection within %v", patience)
		}
	}
}
