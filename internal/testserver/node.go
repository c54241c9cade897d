package testserver

import "testing"

// node is the control a test has over one server process it started:
// embedded in the server types, it gives them Stop, Kill, Pause, Resume,
// Restart and PID.
type node struct {
	t      testing.TB
	proc   *process     // nil for an external server
	envVar string       // names the variable that gave an external server
	ready  func() error // nil: no readiness check after Restart
}

func (n *node) control(what string) *process {
	n.t.Helper()
	if n.proc == nil {
		notControllable(n.t, what, n.envVar)
	}
	return n.proc
}

// Stop shuts the server down gracefully and waits until it has exited.
// Stopping a stopped server does nothing.
func (n *node) Stop() {
	n.t.Helper()
	n.control("stop").stop()
}

// Kill ends the server with SIGKILL and waits until it has exited.
func (n *node) Kill() {
	n.t.Helper()
	n.control("kill").kill()
}

// Pause freezes the server (SIGSTOP): its connections stay open and
// nothing answers until Resume.
func (n *node) Pause() {
	n.t.Helper()
	if err := n.control("pause").pause(); err != nil {
		n.t.Fatalf("testserver: %v", err)
	}
}

// Resume continues a paused server (SIGCONT).
func (n *node) Resume() {
	n.t.Helper()
	if err := n.control("resume").resume(); err != nil {
		n.t.Fatalf("testserver: %v", err)
	}
}

// Start starts a stopped or killed server again on the same address and
// data directory and waits until it answers. Unlike Restart it does not
// wait for a running server to stop first; starting a running server fails
// the test.
func (n *node) Start() {
	n.t.Helper()
	p := n.control("start")
	if err := p.start(); err != nil {
		n.t.Fatalf("testserver: %v", err)
	}
	if n.ready != nil {
		if err := p.waitReady(n.ready); err != nil {
			n.t.Fatalf("testserver: start: %v", err)
		}
	}
}

// Restart stops the server if it runs, starts it again on the same
// address and data directory and waits until it answers.
func (n *node) Restart() {
	n.t.Helper()
	n.control("restart").stop()
	n.Start()
}

// PID returns the server's process id, or 0 when it is not running or was
// not started by the test.
func (n *node) PID() int {
	if n.proc == nil {
		return 0
	}
	return n.proc.pid()
}
