package testserver

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

var zookeeperKind = kind{
	name:    "zookeeper",
	envVar:  "DISTLOCK_TEST_ZOOKEEPER",
	binary:  "java and ZooKeeper's jars (/usr/share/java/zookeeper.jar)",
	install: "apt-get install zookeeper",
	image:   "zookeeper:3.8",
}

// zookeeperJar is where Debian's libzookeeper-java puts the server. Its
// manifest's Class-Path names the jars it needs.
const zookeeperJar = "/usr/share/java/zookeeper.jar"

// ZooKeeperServer is a ZooKeeper server for one test: standalone, or one
// member of a [ZooKeeperEnsembleServer]. Its Stop, Kill, Pause, Resume and
// Restart keep the data directory, so a restarted member rejoins with its
// data.
type ZooKeeperServer struct {
	// Addr is the client address, "127.0.0.1:port".
	Addr string

	node
}

// ZooKeeperEnsembleServer is a ZooKeeper ensemble for one test.
type ZooKeeperEnsembleServer struct {
	// Addrs are the members' client addresses.
	Addrs []string
	// Members are the members, in the order of Addrs; member i has myid i+1.
	Members []*ZooKeeperServer
}

// ZooKeeper starts a standalone ZooKeeper server for t from Debian's
// zookeeper package (java -Xmx256m with its jars, the admin server off) and
// stops it when t ends. DISTLOCK_TEST_ZOOKEEPER=host:port makes it use a
// running server instead.
//
// The tick is 200ms: sessions may time out between 400ms and 60s.
func ZooKeeper(t testing.TB) *ZooKeeperServer {
	t.Helper()
	java, ok := zookeeperInstalled()
	src, env := zookeeperKind.choose(t, ok)
	switch src {
	case sourceEnv:
		return &ZooKeeperServer{Addr: env, node: node{t: t, envVar: zookeeperKind.envVar}}
	case sourceDocker:
		addr := dockerRun(t, zookeeperKind, 2181, []string{"ZOO_4LW_COMMANDS_WHITELIST=*", "ZOO_ADMINSERVER_ENABLED=false"})
		if err := pollReady(func() error { _, err := zookeeperMode(addr); return err }); err != nil {
			t.Fatalf("testserver: zookeeper in docker: %v", err)
		}
		return &ZooKeeperServer{Addr: addr, node: node{t: t, envVar: zookeeperKind.envVar}}
	}
	var s *ZooKeeperServer
	startOnFreePort(t, func(port int) *process {
		s = newZooKeeper(t, java, t.TempDir(), "zookeeper", port, 0, nil)
		return s.proc
	}, func(_ *process, port int) error {
		_, err := zookeeperMode(hostPort(port))
		return err
	})
	return s
}

// ZooKeeperEnsemble starts an ensemble of n ZooKeeper servers (n odd, 3 or
// more), waits until it has a leader and every member serves, and stops it
// when t ends. DISTLOCK_TEST_ZOOKEEPER_ENSEMBLE=addr1,addr2,... makes it use
// running servers instead (they cannot be stopped by the test).
func ZooKeeperEnsemble(t testing.TB, n int) *ZooKeeperEnsembleServer {
	t.Helper()
	if n < 3 || n%2 == 0 {
		t.Fatalf("testserver: ZooKeeperEnsemble(%d): n must be odd and at least 3", n)
	}
	k := zookeeperKind
	k.envVar = "DISTLOCK_TEST_ZOOKEEPER_ENSEMBLE"
	k.image = "" // an ensemble of containers needs a network: not worth it
	java, ok := zookeeperInstalled()
	src, env := k.choose(t, ok)
	e := &ZooKeeperEnsembleServer{}
	if src == sourceEnv {
		e.Addrs = splitList(env)
		for _, a := range e.Addrs {
			e.Members = append(e.Members, &ZooKeeperServer{Addr: a, node: node{t: t, envVar: k.envVar}})
		}
		return e
	}
	// client, quorum and election port per member, all held until the
	// servers start so that no other test takes them.
	ports, release, err := reservePorts(3 * n)
	if err != nil {
		t.Fatalf("testserver: %v", err)
	}
	var servers []string
	for i := range n {
		servers = append(servers, fmt.Sprintf("server.%d=127.0.0.1:%d:%d", i+1, ports[3*i+1], ports[3*i+2]))
	}
	release()
	for i := range n {
		dir := t.TempDir()
		s := newZooKeeper(t, java, dir, fmt.Sprintf("zookeeper%d", i+1), ports[3*i], i+1, servers)
		e.Members = append(e.Members, s)
		e.Addrs = append(e.Addrs, s.Addr)
	}
	t.Cleanup(func() {
		var ps []*process
		for _, s := range e.Members {
			ps = append(ps, s.proc)
		}
		killAll(ps)
	})
	for _, s := range e.Members {
		if err := s.proc.start(); err != nil {
			t.Fatalf("testserver: %v", err)
		}
	}
	for _, s := range e.Members {
		if err := s.proc.waitReady(s.ready); err != nil {
			t.Fatalf("testserver: ensemble: %v", err)
		}
	}
	if err := pollReady(func() error { _, err := e.Leader(); return err }); err != nil {
		t.Fatalf("testserver: ensemble: %v", err)
	}
	return e
}

// Leader returns the index in Members of the current leader.
func (e *ZooKeeperEnsembleServer) Leader() (int, error) {
	var modes []string
	for i, a := range e.Addrs {
		mode, err := zookeeperMode(a)
		if mode == "leader" {
			return i, nil
		}
		modes = append(modes, fmt.Sprintf("%s: %s%v", a, mode, errString(err)))
	}
	return -1, fmt.Errorf("zookeeper: no leader (%s)", strings.Join(modes, "; "))
}

func errString(err error) string {
	if err == nil {
		return ""
	}
	return " " + err.Error()
}

// zookeeperInstalled returns java's path and whether java and ZooKeeper's
// jar are there.
func zookeeperInstalled() (string, bool) {
	java, err := exec.LookPath("java")
	if err != nil {
		return "", false
	}
	if _, err := os.Stat(zookeeperJar); err != nil {
		return "", false
	}
	return java, true
}

// newZooKeeper writes the configuration of one server into dir and returns
// it, not started. myid 0 makes a standalone server.
func newZooKeeper(t testing.TB, java, dir, name string, port, myid int, servers []string) *ZooKeeperServer {
	t.Helper()
	data := filepath.Join(dir, "data")
	if err := os.MkdirAll(data, 0o755); err != nil {
		t.Fatalf("testserver: %v", err)
	}
	cfg := []string{
		"tickTime=200",
		"initLimit=50",
		"syncLimit=25",
		"minSessionTimeout=400",
		"maxSessionTimeout=60000",
		"dataDir=" + data,
		"clientPort=" + strconv.Itoa(port),
		"clientPortAddress=127.0.0.1",
		"maxClientCnxns=0",
		"admin.enableServer=false",
		"4lw.commands.whitelist=*",
		"autopurge.purgeInterval=0",
	}
	if myid > 0 {
		cfg = append(cfg, servers...)
		cfg = append(cfg, "standaloneEnabled=false", "electionPortBindRetry=10")
		if err := os.WriteFile(filepath.Join(data, "myid"), []byte(strconv.Itoa(myid)+"\n"), 0o644); err != nil {
			t.Fatalf("testserver: %v", err)
		}
	}
	cfgPath := filepath.Join(dir, "zoo.cfg")
	if err := os.WriteFile(cfgPath, []byte(strings.Join(cfg, "\n")+"\n"), 0o644); err != nil {
		t.Fatalf("testserver: %v", err)
	}
	cp := []string{dir, zookeeperJar}
	// Debian's zookeeper.jar does not bring a logging backend; without one
	// the log is empty. slf4j-simple writes to stderr, into the log file.
	if _, err := os.Stat("/usr/share/java/slf4j-simple.jar"); err == nil {
		cp = append(cp, "/usr/share/java/slf4j-simple.jar")
	}
	addr := hostPort(port)
	p := newProcess(t, name+" "+addr, filepath.Join(dir, "zookeeper.log"), java,
		"-Xmx256m",
		"-XX:+UseSerialGC",
		"-XX:TieredStopAtLevel=1",
		"-XX:-UsePerfData", // no /tmp/hsperfdata_* left behind
		"-Djava.net.preferIPv4Stack=true",
		"-Dzookeeper.admin.enableServer=false",
		"-Dorg.slf4j.simpleLogger.defaultLogLevel=info",
		"-Dorg.slf4j.simpleLogger.showDateTime=true",
		"-cp", strings.Join(cp, ":"),
		"org.apache.zookeeper.server.quorum.QuorumPeerMain", cfgPath)
	p.dir = dir
	ready := func() error {
		_, err := zookeeperMode(addr)
		return err
	}
	return &ZooKeeperServer{Addr: addr, node: node{t: t, proc: p, ready: ready}}
}

// zookeeperMode asks the server at addr for its mode with the srvr
// command: "standalone", "leader" or "follower". It fails while the
// server does not serve clients.
func zookeeperMode(addr string) (string, error) {
	c, err := net.DialTimeout("tcp", addr, 2*time.Second)
	if err != nil {
		return "", err
	}
	defer c.Close()
	if err := c.SetDeadline(time.Now().Add(5 * time.Second)); err != nil {
		return "", err
	}
	if _, err := io.WriteString(c, "srvr"); err != nil {
		return "", err
	}
	sc := bufio.NewScanner(c)
	var first string
	for sc.Scan() {
		line := sc.Text()
		if first == "" {
			first = line
		}
		if mode, ok := strings.CutPrefix(line, "Mode: "); ok {
			return mode, nil
		}
	}
	if err := sc.Err(); err != nil {
		return "", err
	}
	return "", fmt.Errorf("zookeeper %s: not serving: %q", addr, first)
}

// reservePorts returns n free ports and a function that releases them;
// until then no other process can take them.
func reservePorts(n int) ([]int, func(), error) {
	var ls []net.Listener
	release := func() {
		for _, l := range ls {
			l.Close()
		}
	}
	var ports []int
	for range n {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			release()
			return nil, nil, err
		}
		ls = append(ls, l)
		ports = append(ports, l.Addr().(*net.TCPAddr).Port)
	}
	return ports, release, nil
}
