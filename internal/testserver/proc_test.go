package testserver

import (
	"bufio"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"
)

func TestCleanupLeavesNothing(t *testing.T) {
	var pids []int
	var dirs []string
	t.Run("servers", func(t *testing.T) {
		r := Redis(t)
		p := Postgres(t)
		z := ZooKeeper(t)
		for _, n := range []*node{&r.node, &p.node, &z.node} {
			if n.proc == nil {
				t.Skip("servers not started by the test")
			}
			pids = append(pids, n.PID())
			pids = append(pids, descendants(n.PID())...)
			dirs = append(dirs, n.proc.dir)
		}
		p.Pause() // cleanup must stop a paused server too
	})
	for _, pid := range pids {
		if alive(pid) {
			t.Errorf("process %d is still running after the test ended", pid)
		}
	}
	for _, d := range dirs {
		if _, err := os.Stat(d); !os.IsNotExist(err) {
			t.Errorf("temp dir %s is still there after the test ended (%v)", d, err)
		}
	}
}

// crashHelperEnv makes TestCrashedTestBinaryTakesItsServers, run again as a
// child, start a server, print its pid and wait to be killed.
const crashHelperEnv = "DISTLOCK_TESTSERVER_CRASH_HELPER"

func TestCrashedTestBinaryTakesItsServers(t *testing.T) {
	if os.Getenv(crashHelperEnv) != "" {
		s := Redis(t)
		fmt.Printf("pid %d\n", s.PID())
		select {} // until killed
	}
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(exe, "-test.run=^TestCrashedTestBinaryTakesItsServers$", "-test.v")
	// The child's temp dirs go under ours: killed, it cannot remove them.
	cmd.Env = append(os.Environ(), crashHelperEnv+"=1", "TMPDIR="+t.TempDir())
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer cmd.Process.Kill()
	pid := 0
	sc := bufio.NewScanner(out)
	for sc.Scan() {
		if s, ok := strings.CutPrefix(sc.Text(), "pid "); ok {
			pid, _ = strconv.Atoi(s)
			break
		}
		if strings.HasPrefix(sc.Text(), "--- SKIP") {
			t.Skipf("helper skipped: %s", sc.Text())
		}
	}
	if pid == 0 {
		t.Fatal("the helper printed no server pid")
	}
	if !alive(pid) {
		t.Fatalf("server %d is not running while its test runs", pid)
	}
	// A crash: no cleanup runs.
	if err := cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	_ = cmd.Wait()
	deadline := time.Now().Add(10 * time.Second)
	for alive(pid) {
		if time.Now().After(deadline) {
			syscallKill(pid)
			t.Fatalf("server %d still runs after its test binary was killed", pid)
		}
		time.Sleep(10 * time.Millisecond) // polling with a deadline
	}
}

func syscallKill(pid int) {
	if p, err := os.FindProcess(pid); err == nil {
		p.Kill()
	}
}
