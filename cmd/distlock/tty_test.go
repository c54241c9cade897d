//go:build linux

package main

import (
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/distlock/distlock/internal/testserver"
)

// TestTerminal runs distlock as an interactive shell would, on a
// pseudo-terminal it controls: the command gets the terminal's
// foreground, so it reads what is typed (instead of being stopped by
// SIGTTIN) and ^C reaches it once, directly.
func TestTerminal(t *testing.T) {
	url := "redis://" + testserver.Redis(t).Addr
	key := uniqueKey(t)
	ptm, pts := openPTY(t)
	file := filepath.Join(t.TempDir(), "child")
	cmd := exec.Command(bin, append([]string{"run", "--store", url, key}, childCmd("-file", file, "-hold", "stdin", "-signals")...)...)
	cmd.Env = append(os.Environ(), "DISTLOCK_TEST_CHILD=1", raceOptions)
	cmd.Stdin, cmd.Stdout, cmd.Stderr = pts, pts, pts
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true, Setctty: true, Ctty: 0} // a session whose terminal is pts
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	go io.Copy(io.Discard, ptm) // what the terminal shows
	waitRecord(t, file, "start")

	if _, err := ptm.Write([]byte{0x03}); err != nil { // ^C
		t.Fatal(err)
	}
	waitRecord(t, file, "signal")
	if _, err := ptm.Write([]byte("typed\n\x04")); err != nil { // a line, then ^D: the end of the child's input
		t.Fatal(err)
	}
	select {
	case err := <-exited:
		if err != nil {
			t.Errorf("distlock: %v; want status 0", err)
		}
	case <-time.After(patience):
		cmd.Process.Kill()
		t.Fatalf("distlock still runs %v after ^D: its command could not read the terminal", patience)
	}
	var ints int
	for _, r := range readRecords(t, file) {
		if r.event == "signal" {
			if r.name != "INT" {
				t.Errorf("the command got %s; want INT only", r.name)
			}
			ints++
		}
	}
	if ints != 1 {
		t.Errorf("the command got SIGINT %d times for one ^C; want once", ints)
	}
	if rs := readRecords(t, file); rs[len(rs)-1].event != "end" {
		t.Errorf("the command did not end by reading its input to the end: %+v", rs)
	}
}

// openPTY opens a pseudo-terminal: its master, and its slave, which is
// nobody's controlling terminal yet.
func openPTY(t *testing.T) (ptm, pts *os.File) {
	t.Helper()
	ptm, err := os.OpenFile("/dev/ptmx", os.O_RDWR|syscall.O_NOCTTY, 0)
	if err != nil {
		if os.Getenv("CI") != "" {
			t.Fatalf("no pseudo-terminal: %v", err)
		}
		t.Skipf("no pseudo-terminal: %v (with CI set, this fails)", err)
	}
	t.Cleanup(func() { ptm.Close() })
	if err := unix.IoctlSetPointerInt(int(ptm.Fd()), unix.TIOCSPTLCK, 0); err != nil {
		t.Fatal(err)
	}
	n, err := unix.IoctlGetInt(int(ptm.Fd()), unix.TIOCGPTN)
	if err != nil {
		t.Fatal(err)
	}
	pts, err = os.OpenFile(fmt.Sprintf("/dev/pts/%d", n), os.O_RDWR|syscall.O_NOCTTY, 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { pts.Close() })
	return ptm, pts
}
