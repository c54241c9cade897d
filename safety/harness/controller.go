package harness

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// Worker is a worker process started by [StartWorker]: the test binary
// executed again, so that it can be paused (SIGSTOP) like a process in a
// long GC pause, its lock's keep-alive goroutines included.
type Worker struct {
	Name string

	t      testing.TB
	cmd    *exec.Cmd
	stdin  io.WriteCloser
	log    string
	exited chan struct{}
	err    error

	mu    sync.Mutex
	lines []string
	cond  *sync.Cond
}

// StartWorker starts a worker process running cfg; it is killed (by PID)
// when t ends if it still runs, and its stderr is dumped if t failed.
// Call [MaybeRunWorker] in the test binary's TestMain.
func StartWorker(t testing.TB, cfg Config) *Worker {
	t.Helper()
	exe, err := os.Executable()
	if err != nil {
		t.Fatalf("harness: %v", err)
	}
	js, err := json.Marshal(cfg)
	if err != nil {
		t.Fatalf("harness: %v", err)
	}
	w := &Worker{Name: cfg.Name, t: t, exited: make(chan struct{}),
		log: filepath.Join(filepath.Dir(cfg.History), cfg.Name+".stderr")}
	w.cond = sync.NewCond(&w.mu)
	logf, err := os.Create(w.log)
	if err != nil {
		t.Fatalf("harness: %v", err)
	}
	cmd := exec.Command(exe, "-test.run=^$")
	if cfg.Netns != "" {
		// ip netns exec joins the namespace and execs exe: same pid.
		cmd = exec.Command("ip", "netns", "exec", cfg.Netns, exe, "-test.run=^$")
	}
	cmd.Env = append(os.Environ(), workerEnv+"="+string(js))
	cmd.Stderr = logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatalf("harness: %v", err)
	}
	if w.stdin, err = cmd.StdinPipe(); err != nil {
		t.Fatalf("harness: %v", err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatalf("harness: start worker %s: %v", cfg.Name, err)
	}
	logf.Close()
	w.cmd = cmd
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			w.mu.Lock()
			w.lines = append(w.lines, sc.Text())
			w.cond.Broadcast()
			w.mu.Unlock()
		}
		w.err = cmd.Wait()
		w.mu.Lock()
		close(w.exited)
		w.cond.Broadcast()
		w.mu.Unlock()
	}()
	t.Cleanup(func() {
		w.Kill()
		if t.Failed() {
			b, _ := os.ReadFile(w.log)
			t.Logf("worker %s stderr:\n%s", w.Name, b)
		}
	})
	return w
}

// PID returns the worker's process id.
func (w *Worker) PID() int { return w.cmd.Process.Pid }

func (w *Worker) running() bool {
	select {
	case <-w.exited:
		return false
	default:
		return true
	}
}

// Pause stops the worker with SIGSTOP.
func (w *Worker) Pause() {
	w.t.Helper()
	w.signal(syscall.SIGSTOP)
}

// Resume continues it with SIGCONT.
func (w *Worker) Resume() {
	w.t.Helper()
	w.signal(syscall.SIGCONT)
}

func (w *Worker) signal(sig syscall.Signal) {
	w.t.Helper()
	if !w.running() {
		w.t.Fatalf("harness: worker %s: %v: it has exited (%v)", w.Name, sig, w.err)
	}
	if err := w.cmd.Process.Signal(sig); err != nil {
		w.t.Fatalf("harness: worker %s: %v: %v", w.Name, sig, err)
	}
}

// Stop asks the worker to stop after its current holding (closes its
// stdin) and waits at most timeout for it to exit; it fails the test if
// the worker did not exit cleanly.
func (w *Worker) Stop(timeout time.Duration) {
	w.t.Helper()
	_ = w.stdin.Close()
	_ = w.cmd.Process.Signal(syscall.SIGCONT) // a paused worker cannot stop
	select {
	case <-w.exited:
	case <-time.After(timeout):
		w.Kill()
		w.t.Fatalf("harness: worker %s did not stop within %v", w.Name, timeout)
	}
	if w.err != nil {
		b, _ := os.ReadFile(w.log)
		w.t.Fatalf("harness: worker %s: %v\n%s", w.Name, w.err, b)
	}
}

// Kill kills the worker (SIGKILL, by PID) if it runs and waits for it.
func (w *Worker) Kill() {
	if w.running() {
		_ = w.cmd.Process.Signal(syscall.SIGKILL)
		<-w.exited
	}
}

// WaitLine waits at most timeout for a line from the worker that starts
// with prefix, after the first skip such lines, and returns it.
func (w *Worker) WaitLine(prefix string, skip int, timeout time.Duration) (string, error) {
	deadline := time.Now().Add(timeout)
	timer := time.AfterFunc(timeout, func() {
		w.mu.Lock()
		w.cond.Broadcast()
		w.mu.Unlock()
	})
	defer timer.Stop()
	w.mu.Lock()
	defer w.mu.Unlock()
	for {
		n := 0
		for _, l := range w.lines {
			if strings.HasPrefix(l, prefix) {
				if n == skip {
					return l, nil
				}
				n++
			}
		}
		select {
		case <-w.exited:
			return "", fmt.Errorf("worker %s exited (%v) before saying %q", w.Name, w.err, prefix)
		default:
		}
		if !time.Now().Before(deadline) {
			return "", fmt.Errorf("worker %s did not say %q within %v", w.Name, prefix, timeout)
		}
		w.cond.Wait()
	}
}

// Count returns how many lines the worker said that start with prefix.
func (w *Worker) Count(prefix string) int {
	w.mu.Lock()
	defer w.mu.Unlock()
	n := 0
	for _, l := range w.lines {
		if strings.HasPrefix(l, prefix) {
			n++
		}
	}
	return n
}
