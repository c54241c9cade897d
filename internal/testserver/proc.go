package testserver

import (
	"bytes"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// startTimeout bounds how long a server may take to answer after it was
// started. It is generous: two cores are shared by many test binaries.
const startTimeout = 60 * time.Second

// stopTimeout bounds a graceful stop before the process is killed.
const stopTimeout = 15 * time.Second

// process is one server process the test started. It can be stopped and
// started again with the same arguments, so the server keeps its port and
// data directory across a restart. All output goes to one log file, dumped
// when the test fails.
type process struct {
	t    testing.TB
	name string   // for messages: "redis 127.0.0.1:6379"
	argv []string // program and arguments
	env  []string // nil: inherit
	dir  string   // working directory
	log  string   // log file path
	cred *syscall.Credential
	// stopSig asks the server to shut down; SIGTERM when zero.
	stopSig syscall.Signal
	// afterCleanup, if set, runs when the test ends, after the process
	// was stopped: to remove what a killed server could not.
	afterCleanup func()

	mu      sync.Mutex
	cmd     *exec.Cmd
	exited  chan struct{} // closed when cmd has been reaped
	waitErr error
	paused  bool
}

// newProcess registers a cleanup that stops the process and dumps its log
// if the test failed. It does not start it.
func newProcess(t testing.TB, name, log string, argv ...string) *process {
	p := &process{t: t, name: name, argv: argv, log: log}
	t.Cleanup(func() {
		p.stop()
		if p.afterCleanup != nil {
			p.afterCleanup()
		}
		if t.Failed() {
			p.dumpLog()
		}
	})
	return p
}

// start starts the process; it does not wait for it to answer.
func (p *process) start() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cmd != nil {
		return fmt.Errorf("%s: already running", p.name)
	}
	f, err := os.OpenFile(p.log, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	defer f.Close()
	fmt.Fprintf(f, "\n=== testserver: start %q at %s\n", p.argv, time.Now().Format(time.RFC3339Nano))
	cmd := exec.Command(p.argv[0], p.argv[1:]...)
	cmd.Dir = p.dir
	cmd.Env = p.env
	cmd.Stdout = f
	cmd.Stderr = f
	cmd.SysProcAttr = &syscall.SysProcAttr{
		// Own process group: signals go to the server (and helpers in
		// its group) and never to the test binary.
		Setpgid: true,
		// The kernel kills the server if the test binary dies first.
		Pdeathsig:  syscall.SIGKILL,
		Credential: p.cred,
	}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("%s: start: %w", p.name, err)
	}
	p.cmd = cmd
	p.paused = false
	exited := make(chan struct{})
	p.exited = exited
	go func() {
		err := cmd.Wait()
		p.mu.Lock()
		p.waitErr = err
		p.mu.Unlock()
		close(exited)
	}()
	return nil
}

// current returns the current process and its exit channel, or nils.
func (p *process) current() (*exec.Cmd, chan struct{}) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.cmd, p.exited
}

// hasExited reports whether the current process has ended on its own.
func (p *process) hasExited() bool {
	_, exited := p.current()
	if exited == nil {
		return true
	}
	select {
	case <-exited:
		return true
	default:
		return false
	}
}

// signal sends sig to the server and every process under it.
// PostgreSQL's backends make themselves group leaders (setsid), so the
// server's process group alone does not reach them.
func (p *process) signal(sig syscall.Signal) error {
	cmd, _ := p.current()
	if cmd == nil || p.hasExited() {
		// Once reaped, its pid may belong to another process.
		return fmt.Errorf("%s: not running", p.name)
	}
	root := cmd.Process.Pid
	under := descendants(root)
	// The group id is the server's pid (Setpgid), so this reaches only
	// processes this test started.
	if err := syscall.Kill(-root, sig); err != nil && !errors.Is(err, syscall.ESRCH) {
		return fmt.Errorf("%s: signal %v: %w", p.name, sig, err)
	}
	for _, pid := range under {
		_ = syscall.Kill(pid, sig)
	}
	return nil
}

// pause stops the server with SIGSTOP, and returns once every thread of
// it and of the processes under it has stopped; resume continues it.
func (p *process) pause() error {
	if err := p.signal(syscall.SIGSTOP); err != nil {
		return err
	}
	p.mu.Lock()
	p.paused = true
	p.mu.Unlock()
	if root := p.pid(); root != 0 {
		return waitStopped(p.name, append([]int{root}, descendants(root)...))
	}
	return nil
}

// waitStopped waits until every thread of pids is stopped. kill returns
// once SIGSTOP is sent; each thread stops when it next leaves the kernel,
// and on a loaded machine a server (a JVM's many threads) was seen
// answering requests for milliseconds after that.
func waitStopped(name string, pids []int) error {
	deadline := time.Now().Add(stopTimeout)
	for {
		running := 0
		for _, pid := range pids {
			tasks, err := os.ReadDir("/proc/" + strconv.Itoa(pid) + "/task")
			if err != nil {
				continue // gone, or no /proc: nothing to wait for
			}
			for _, task := range tasks {
				b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/task/" + task.Name() + "/stat")
				if err != nil {
					continue // the thread ended
				}
				if state, ok := statState(b); ok && !strings.ContainsRune("TtZX", rune(state)) {
					running++
				}
			}
		}
		if running == 0 {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s: %d threads still running %v after SIGSTOP", name, running, stopTimeout)
		}
		time.Sleep(time.Millisecond) // polling with a deadline
	}
}

func (p *process) resume() error {
	if err := p.signal(syscall.SIGCONT); err != nil {
		return err
	}
	p.mu.Lock()
	p.paused = false
	p.mu.Unlock()
	return nil
}

// stop ends the server gracefully (SIGTERM), killing it if it does not exit
// within stopTimeout, and waits until it is reaped. Stopping a stopped
// process does nothing.
func (p *process) stop() {
	sig := p.stopSig
	if sig == 0 {
		sig = syscall.SIGTERM
	}
	p.end(sig, stopTimeout)
}

// kill ends the server with SIGKILL and waits until it is reaped.
func (p *process) kill() { p.end(syscall.SIGKILL, stopTimeout) }

func (p *process) end(sig syscall.Signal, timeout time.Duration) {
	cmd, exited := p.current()
	if cmd == nil {
		return
	}
	root := cmd.Process.Pid
	p.mu.Lock()
	paused := p.paused
	p.mu.Unlock()
	if p.hasExited() {
		// It died on its own; its pid may belong to another process now.
		sig = 0
	}
	if sig != 0 && sig != syscall.SIGKILL {
		// The server shuts its children down itself.
		_ = syscall.Kill(-root, sig)
		if paused {
			// A stopped process keeps the signal pending until it
			// continues.
			_ = p.signal(syscall.SIGCONT)
		}
		select {
		case <-exited:
		case <-time.After(timeout):
			sig = syscall.SIGKILL
		}
	}
	if sig == syscall.SIGKILL {
		// Its children are not killed with it: they are found first,
		// killed too and waited for, so that a server started again does
		// not find them holding its shared memory or files.
		under := descendants(root)
		_ = p.signal(syscall.SIGKILL)
		<-exited
		deadline := time.Now().Add(stopTimeout)
		for _, pid := range under {
			for alive(pid) && time.Now().Before(deadline) {
				time.Sleep(5 * time.Millisecond) // polling with a deadline
			}
		}
	}
	p.mu.Lock()
	p.cmd, p.exited, p.paused = nil, nil, false
	p.mu.Unlock()
}

// descendants returns the pids of the processes under root, read from
// /proc.
func descendants(root int) []int {
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return nil
	}
	children := map[int][]int{}
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		if _, ppid, ok := procStat(pid); ok {
			children[ppid] = append(children[ppid], pid)
		}
	}
	var out []int
	queue := []int{root}
	for len(queue) > 0 {
		pid := queue[0]
		queue = queue[1:]
		for _, c := range children[pid] {
			out = append(out, c)
			queue = append(queue, c)
		}
	}
	return out
}

// statState returns the state letter of a /proc/.../stat line: "pid
// (comm) state ppid ...", where comm may hold spaces and parentheses.
func statState(b []byte) (byte, bool) {
	i := bytes.LastIndexByte(b, ')')
	if i < 0 || i+2 >= len(b) || b[i+1] != ' ' {
		return 0, false
	}
	return b[i+2], true
}

// alive reports whether pid exists and is not a zombie.
func alive(pid int) bool {
	state, _, ok := procStat(pid)
	return ok && state != 'Z'
}

// procStat reads a process's state and parent pid from /proc/pid/stat.
func procStat(pid int) (state byte, ppid int, ok bool) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0, 0, false
	}
	state, ok = statState(b)
	if !ok {
		return 0, 0, false
	}
	i := bytes.LastIndexByte(b, ')')
	f := strings.Fields(string(b[i+1:]))
	if len(f) < 2 || len(f[0]) != 1 {
		return 0, 0, false
	}
	ppid, err = strconv.Atoi(f[1])
	if err != nil {
		return 0, 0, false
	}
	return state, ppid, true
}

// killAll kills the processes concurrently. It ends clusters at cleanup:
// members shut down gracefully would wait for each other (an etcd leader
// tries for seconds to hand its leadership over), and their data is
// thrown away anyway.
func killAll(ps []*process) {
	var wg sync.WaitGroup
	for _, p := range ps {
		wg.Go(p.kill)
	}
	wg.Wait()
}

// run starts the process and waits until it exits, for set-up commands
// such as initdb. It fails if the command fails.
func (p *process) run() error {
	if err := p.start(); err != nil {
		return err
	}
	_, exited := p.current()
	select {
	case <-exited:
	case <-time.After(startTimeout):
		p.kill()
		return fmt.Errorf("%s did not finish within %v", p.name, startTimeout)
	}
	err := p.exitErr()
	p.mu.Lock()
	p.cmd, p.exited = nil, nil
	p.mu.Unlock()
	if err != nil {
		return fmt.Errorf("%s: %w", p.name, err)
	}
	return nil
}

// pid returns the server's pid, or 0 when it is not running.
func (p *process) pid() int {
	cmd, _ := p.current()
	if cmd == nil {
		return 0
	}
	return cmd.Process.Pid
}

// waitReady polls ready until it succeeds, the process exits, or
// startTimeout passes.
func (p *process) waitReady(ready func() error) error {
	deadline := time.Now().Add(startTimeout)
	delay := 10 * time.Millisecond
	for {
		err := ready()
		if err == nil {
			return nil
		}
		if p.hasExited() {
			return fmt.Errorf("%s exited before it answered (%v); log:\n%s", p.name, p.exitErr(), p.tail())
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s did not answer within %v: %v; log:\n%s", p.name, startTimeout, err, p.tail())
		}
		time.Sleep(delay) // polling with a deadline
		delay = min(2*delay, 200*time.Millisecond)
	}
}

func (p *process) exitErr() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.waitErr
}

// tail returns the last part of the log.
func (p *process) tail() string {
	b, err := os.ReadFile(p.log)
	if err != nil {
		return err.Error()
	}
	const max = 8 << 10
	if len(b) > max {
		b = b[len(b)-max:]
		if i := bytes.IndexByte(b, '\n'); i >= 0 {
			b = b[i+1:]
		}
	}
	return string(b)
}

func (p *process) dumpLog() {
	p.t.Logf("testserver: log of %s (%s):\n%s", p.name, p.log, p.tail())
}

// freePort returns a TCP port on 127.0.0.1 that was free a moment ago.
// A server that then fails to bind it is started again on another port.
func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// hostPort formats 127.0.0.1:port.
func hostPort(port int) string {
	return net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
}

// startOnFreePort builds a process with build for a fresh port, starts it
// and waits for ready, trying again with another port when the server
// exits early (most likely because another process took the port).
func startOnFreePort(t testing.TB, build func(port int) *process, ready func(p *process, port int) error) (*process, int) {
	t.Helper()
	var lastErr error
	for range 3 {
		port, err := freePort()
		if err != nil {
			t.Fatalf("testserver: free port: %v", err)
		}
		p := build(port)
		if err := p.start(); err != nil {
			t.Fatalf("testserver: %v", err)
		}
		err = p.waitReady(func() error { return ready(p, port) })
		if err == nil {
			return p, port
		}
		lastErr = err
		exited := p.hasExited()
		p.stop()
		if !exited {
			break // it ran but never answered: another port will not help
		}
	}
	t.Fatalf("testserver: %v", lastErr)
	return nil, 0
}
