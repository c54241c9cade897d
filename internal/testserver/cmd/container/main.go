// Command container runs one server in a Docker container through
// testcontainers-go, for package testserver's Docker fallback (taken when
// neither an address in the environment nor a local binary is there).
// testserver builds it from this directory only then, so that
// testcontainers-go and the Docker client are dependencies of this helper
// alone, never of the modules whose tests start servers.
//
//	container -ping
//	container -image redis:7 -port 6379 [-env K=V]... -addr-file FILE
//
// With -ping it exits 0 if a Docker engine answers. Otherwise it starts the
// image with the port published on 127.0.0.1, waits until the port
// listens, writes "127.0.0.1:port" to the address file, copies the
// container's log to stderr, and on SIGTERM or SIGINT removes the
// container and exits. If the helper dies, testcontainers' reaper (Ryuk)
// removes the container.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/moby/moby/api/types/container"
	"github.com/moby/moby/api/types/network"
	"github.com/moby/moby/client"
	"github.com/testcontainers/testcontainers-go"
	"github.com/testcontainers/testcontainers-go/wait"
)

// envList is a repeatable -env K=V flag.
type envList map[string]string

func (e envList) String() string { return fmt.Sprint(map[string]string(e)) }

func (e envList) Set(s string) error {
	k, v, ok := strings.Cut(s, "=")
	if !ok || k == "" {
		return fmt.Errorf("want K=V, got %q", s)
	}
	e[k] = v
	return nil
}

func main() {
	env := envList{}
	var (
		ping     = flag.Bool("ping", false, "exit 0 if a Docker engine answers, 1 if not")
		image    = flag.String("image", "", "image to run")
		port     = flag.Int("port", 0, "TCP port of the server in the container")
		addrFile = flag.String("addr-file", "", "file to write the published host:port to")
	)
	flag.Var(env, "env", "K=V for the container's environment (repeatable)")
	flag.Parse()
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	if *ping {
		if err := pingEngine(ctx); err != nil {
			fmt.Fprintf(os.Stderr, "container: %v\n", err)
			os.Exit(1)
		}
		return
	}
	if *image == "" || *port <= 0 || *port > 65535 || *addrFile == "" {
		fmt.Fprintln(os.Stderr, "container: -image, -port and -addr-file are required")
		os.Exit(2)
	}
	if err := run(ctx, *image, *port, env, *addrFile); err != nil {
		fmt.Fprintf(os.Stderr, "container: %v\n", err)
		os.Exit(1)
	}
}

// pingEngine asks the Docker engine testcontainers would use for its
// version, within ten seconds.
func pingEngine(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	cli, err := testcontainers.NewDockerClientWithOpts(ctx)
	if err != nil {
		return err
	}
	defer cli.Close()
	_, err = cli.Ping(ctx, client.PingOptions{})
	return err
}

func run(ctx context.Context, image string, port int, env map[string]string, addrFile string) error {
	exposed := strconv.Itoa(port) + "/tcp"
	c, err := testcontainers.Run(ctx, image,
		testcontainers.WithExposedPorts(exposed),
		testcontainers.WithEnv(env),
		testcontainers.WithHostConfigModifier(func(hc *container.HostConfig) {
			// Publish on the loopback interface only, like every server
			// the tests start.
			hc.PortBindings = network.PortMap{
				network.MustParsePort(exposed): {{HostIP: netip.MustParseAddr("127.0.0.1")}},
			}
		}),
		testcontainers.WithWaitStrategyAndDeadline(5*time.Minute, wait.ForListeningPort(exposed)),
		testcontainers.WithLogConsumers(stderrLog{}),
	)
	defer func() {
		if terr := testcontainers.TerminateContainer(c); terr != nil {
			fmt.Fprintf(os.Stderr, "container: %v\n", terr)
		}
	}()
	if err != nil {
		return err
	}
	mapped, err := c.MappedPort(ctx, exposed)
	if err != nil {
		return err
	}
	if err := writeAddr(addrFile, hostPort(mapped.Num())); err != nil {
		return err
	}
	<-ctx.Done()
	if errors.Is(context.Cause(ctx), context.Canceled) {
		return nil
	}
	return context.Cause(ctx)
}

// hostPort is the published address, always on 127.0.0.1.
func hostPort(port uint16) string {
	return net.JoinHostPort("127.0.0.1", strconv.Itoa(int(port)))
}

// writeAddr writes addr to path in one step (a rename), so that a reader
// polling for the file never sees it half written.
func writeAddr(path, addr string) error {
	tmp := filepath.Join(filepath.Dir(path), "."+filepath.Base(path)+".tmp")
	if err := os.WriteFile(tmp, []byte(addr+"\n"), 0o644); err != nil {
		return err
	}
	return os.Rename(tmp, path)
}

// stderrLog copies the container's log to stderr, which testserver writes
// to the server's log file (dumped when the test fails).
type stderrLog struct{}

func (stderrLog) Accept(l testcontainers.Log) { os.Stderr.Write(l.Content) }
