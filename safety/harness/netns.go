package harness

import (
	"fmt"
	"os"
	"os/exec"
	"strings"
	"testing"
)

// Netns is a network namespace joined to the host's by a veth pair: a
// worker started in it ([Config].Netns) reaches the host only over that
// link, which [Netns.Partition] cuts with iptables. The link's addresses
// are private to this machine (a /30 in 10.213.0.0/16).
type Netns struct {
	Name   string
	HostIf string // the host's end of the veth pair
	HostIP string // its address: where a proxy for the worker listens
	NsIP   string

	t     testing.TB
	rules [][]string
}

// NewNetns creates a namespace for t, deleted when t ends. It skips t,
// saying why, when the machine does not allow it (not root, no ip(8) or
// iptables(8), no network namespaces); under CI it fails instead.
func NewNetns(t testing.TB) *Netns {
	t.Helper()
	for _, bin := range []string{"ip", "iptables"} {
		if _, err := exec.LookPath(bin); err != nil {
			unavailable(t, fmt.Sprintf("%s not found (apt-get install iproute2 iptables)", bin))
		}
	}
	id := os.Getpid() % 10000
	n := &Netns{
		Name:   fmt.Sprintf("dlsafety%d", id),
		HostIf: fmt.Sprintf("dls%dh", id),
		HostIP: fmt.Sprintf("10.213.%d.1", id%250),
		NsIP:   fmt.Sprintf("10.213.%d.2", id%250),
		t:      t,
	}
	nsIf := fmt.Sprintf("dls%dn", id)
	// Leftovers of a crashed earlier run with the same pid.
	_ = run("ip", "netns", "del", n.Name)
	_ = run("ip", "link", "del", n.HostIf)
	steps := [][]string{
		{"ip", "netns", "add", n.Name},
		{"ip", "link", "add", n.HostIf, "type", "veth", "peer", "name", nsIf},
		{"ip", "link", "set", nsIf, "netns", n.Name},
		{"ip", "addr", "add", n.HostIP + "/30", "dev", n.HostIf},
		{"ip", "link", "set", n.HostIf, "up"},
		{"ip", "netns", "exec", n.Name, "ip", "addr", "add", n.NsIP + "/30", "dev", nsIf},
		{"ip", "netns", "exec", n.Name, "ip", "link", "set", nsIf, "up"},
		{"ip", "netns", "exec", n.Name, "ip", "link", "set", "lo", "up"},
	}
	t.Cleanup(func() {
		n.Heal()
		_ = run("ip", "link", "del", n.HostIf)
		_ = run("ip", "netns", "del", n.Name)
	})
	for i, s := range steps {
		if err := run(s...); err != nil {
			if i == 0 {
				unavailable(t, err.Error())
			}
			t.Fatalf("harness: netns: %v", err)
		}
	}
	return n
}

func unavailable(t testing.TB, why string) {
	t.Helper()
	if os.Getenv("CI") != "" {
		t.Fatalf("harness: network namespaces unavailable: %s", why)
	}
	t.Skipf("harness: network namespaces unavailable: %s", why)
}

func run(argv ...string) error {
	out, err := exec.Command(argv[0], argv[1:]...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("%s: %v: %s", strings.Join(argv, " "), err, strings.TrimSpace(string(out)))
	}
	return nil
}

// Partition drops every packet between the namespace and the host, both
// ways: connections stay open and hang, as across a real partition.
func (n *Netns) Partition() {
	n.t.Helper()
	for _, r := range [][]string{
		{"INPUT", "-i", n.HostIf, "-j", "DROP"},
		{"OUTPUT", "-o", n.HostIf, "-j", "DROP"},
	} {
		if err := run(append([]string{"iptables", "-I"}, r...)...); err != nil {
			n.t.Fatalf("harness: partition: %v", err)
		}
		n.rules = append(n.rules, r)
	}
}

// Heal removes the rules Partition added.
func (n *Netns) Heal() {
	for _, r := range n.rules {
		_ = run(append([]string{"iptables", "-D"}, r...)...)
	}
	n.rules = nil
}
