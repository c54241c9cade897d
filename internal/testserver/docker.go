package testserver

import (
	"bytes"
	"context"
	"fmt"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"
)

// The Docker fallback runs the docker CLI instead of testcontainers-go:
// testcontainers-go would add the Docker client and its dependency tree
// (dozens of modules) to the library's go.mod, for a path that only
// machines without the binaries and with a Docker engine take.

// dockerRun starts k's image with env, publishing its port on 127.0.0.1,
// and returns the host address. The container is removed when t ends; its
// log is dumped if t failed. The caller waits for the server to answer.
func dockerRun(t testing.TB, k kind, port int, env []string) string {
	t.Helper()
	args := []string{"run", "--detach", "--rm", "--publish", "127.0.0.1::" + strconv.Itoa(port)}
	for _, e := range env {
		args = append(args, "--env", e)
	}
	args = append(args, k.image)
	id, err := docker(5*time.Minute, args...) // may pull the image
	if err != nil {
		t.Fatalf("testserver: %s in docker: %v", k.name, err)
	}
	t.Cleanup(func() {
		if t.Failed() {
			logs, _ := docker(time.Minute, "logs", "--tail", "200", id)
			t.Logf("testserver: log of %s container %s:\n%s", k.name, id, logs)
		}
		if _, err := docker(time.Minute, "rm", "--force", id); err != nil {
			t.Errorf("testserver: remove %s container: %v", k.name, err)
		}
	})
	out, err := docker(time.Minute, "port", id, strconv.Itoa(port)+"/tcp")
	if err != nil {
		t.Fatalf("testserver: %s in docker: %v", k.name, err)
	}
	addr, err := dockerPortAddr(out)
	if err != nil {
		t.Fatalf("testserver: %s in docker: %v", k.name, err)
	}
	return addr
}

// dockerPortAddr picks the IPv4 address from docker port's output
// ("127.0.0.1:49153", one line per binding).
func dockerPortAddr(out string) (string, error) {
	for _, line := range strings.Split(out, "\n") {
		if line = strings.TrimSpace(line); strings.HasPrefix(line, "127.0.0.1:") {
			return line, nil
		}
	}
	return "", fmt.Errorf("no 127.0.0.1 binding in %q", out)
}

// docker runs the docker CLI and returns its trimmed output.
func docker(timeout time.Duration, args ...string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	var stdout, stderr bytes.Buffer
	cmd := exec.CommandContext(ctx, "docker", args...)
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return "", fmt.Errorf("docker %s: %v: %s", strings.Join(args, " "), err, strings.TrimSpace(stderr.String()))
	}
	return strings.TrimSpace(stdout.String()), nil
}
