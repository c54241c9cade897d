package testserver

import (
	"bytes"
	"os"
	"strconv"
	"testing"
	"time"

	"github.com/go-zookeeper/zk"
)

func zkConnect(t *testing.T, addrs []string) *zk.Conn {
	t.Helper()
	conn, _, err := zk.Connect(addrs, 5*time.Second, zk.WithLogInfo(false), zk.WithLogger(tLogger{t}))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(conn.Close)
	return conn
}

func TestZooKeeperCreateGet(t *testing.T) {
	s := ZooKeeper(t)
	if mode, err := zookeeperMode(s.Addr); err != nil || mode != "standalone" {
		t.Fatalf("mode = %q, %v; want standalone", mode, err)
	}
	conn := zkConnect(t, []string{s.Addr})
	if _, err := conn.Create("/smoke", []byte("hello"), 0, zk.WorldACL(zk.PermAll)); err != nil {
		t.Fatal(err)
	}
	got, _, err := conn.Get("/smoke")
	if err != nil || !bytes.Equal(got, []byte("hello")) {
		t.Fatalf("Get(/smoke) = %q, %v; want hello", got, err)
	}
}

// TestZooKeeperPauseStopsEveryThread: once Pause returns, no thread of
// the JVM runs, and a request sent then is not answered until Resume.
func TestZooKeeperPauseStopsEveryThread(t *testing.T) {
	s := ZooKeeper(t)
	conn := zkConnect(t, []string{s.Addr})
	for range 5 {
		s.Pause()
		tasks, err := os.ReadDir("/proc/" + strconv.Itoa(s.PID()) + "/task")
		if err != nil {
			t.Skipf("no /proc: %v", err)
		}
		for _, task := range tasks {
			b, err := os.ReadFile("/proc/" + strconv.Itoa(s.PID()) + "/task/" + task.Name() + "/stat")
			if err != nil {
				continue
			}
			if state, ok := statState(b); ok && state != 'T' {
				t.Errorf("thread %s of the paused server is in state %c", task.Name(), state)
			}
		}
		answered := make(chan error, 1)
		go func() { _, _, err := conn.Exists("/"); answered <- err }()
		select {
		case err := <-answered:
			t.Fatalf("Exists answered (%v) while the server was paused", err)
		case <-time.After(50 * time.Millisecond):
		}
		s.Resume()
		if err := <-answered; err != nil {
			t.Fatalf("Exists after Resume: %v", err)
		}
	}
}

func TestZooKeeperEnsembleSurvivesOneStopped(t *testing.T) {
	e := ZooKeeperEnsemble(t, 3)
	leader, err := e.Leader()
	if err != nil {
		t.Fatal(err)
	}
	conn := zkConnect(t, e.Addrs)
	if _, err := conn.Create("/before", []byte("1"), 0, zk.WorldACL(zk.PermAll)); err != nil {
		t.Fatal(err)
	}

	// Stopping the leader forces an election; the two left keep a quorum.
	e.Members[leader].Stop()
	deadline := time.Now().Add(30 * time.Second)
	for {
		_, err := conn.Create("/after", []byte("2"), 0, zk.WorldACL(zk.PermAll))
		if err == nil || err == zk.ErrNodeExists {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("create after the leader stopped: %v", err)
		}
		time.Sleep(100 * time.Millisecond) // polling with a deadline
	}
	if _, err := e.Leader(); err != nil {
		t.Fatalf("no new leader: %v", err)
	}

	e.Members[leader].Restart()
	if mode, err := zookeeperMode(e.Addrs[leader]); err != nil || mode != "follower" {
		t.Fatalf("restarted member mode = %q, %v; want follower", mode, err)
	}
	solo := zkConnect(t, []string{e.Addrs[leader]})
	if _, err := solo.Sync("/"); err != nil {
		t.Fatal(err)
	}
	if got, _, err := solo.Get("/after"); err != nil || string(got) != "2" {
		t.Fatalf("Get(/after) on the restarted member = %q, %v; want 2", got, err)
	}
}

// tLogger sends the ZooKeeper client's log to the test's log.
type tLogger struct{ t *testing.T }

func (l tLogger) Printf(format string, args ...any) { l.t.Logf(format, args...) }
