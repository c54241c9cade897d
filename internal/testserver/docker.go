package testserver

import (
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// The Docker fallback runs the helper program cmd/container, which starts
// the image with testcontainers-go. The helper is built only when a test
// takes this path, and testcontainers-go is its dependency alone: in this
// package it would be a dependency of every module whose tests start a
// server, and so of every application's build list.

// dockerPullTimeout bounds starting a container, pulling its image
// included.
const dockerPullTimeout = 5 * time.Minute

// dockerRun starts k's image with env, publishing its port on 127.0.0.1,
// and returns the host address. The container is removed when t ends; its
// log is dumped if t failed. The caller waits for the server to answer.
func dockerRun(t testing.TB, k kind, port int, env []string) string {
	t.Helper()
	exe := helperBinary(t, "container")
	dir := t.TempDir()
	addrFile := filepath.Join(dir, "addr")
	argv := []string{exe, "-image", k.image, "-port", strconv.Itoa(port), "-addr-file", addrFile}
	for _, e := range env {
		argv = append(argv, "-env", e)
	}
	p := newProcess(t, k.name+" container ("+k.image+")", filepath.Join(dir, "container.log"), argv...)
	p.dir = dir
	if err := p.start(); err != nil {
		t.Fatalf("testserver: %s in docker: %v", k.name, err)
	}
	deadline := time.Now().Add(dockerPullTimeout)
	for {
		b, err := os.ReadFile(addrFile)
		if err == nil {
			return strings.TrimSpace(string(b))
		}
		if p.hasExited() {
			t.Fatalf("testserver: %s in docker: the helper exited (%v); log:\n%s", k.name, p.exitErr(), p.tail())
		}
		if time.Now().After(deadline) {
			t.Fatalf("testserver: %s in docker: no address within %v; log:\n%s", k.name, dockerPullTimeout, p.tail())
		}
		time.Sleep(100 * time.Millisecond) // polling with a deadline
	}
}

var (
	dockerOnce sync.Once
	dockerUp   bool
)

// dockerAvailable reports whether a Docker engine answers, asked through
// the helper (testcontainers-go finds the engine as it will when starting
// a container). The helper is built only when something hints at an
// engine; the answer is computed once per test binary.
func dockerAvailable(t testing.TB) bool {
	t.Helper()
	dockerOnce.Do(func() {
		home, _ := os.UserHomeDir()
		if !dockerHinted(os.Getenv, fileExists, home) {
			return
		}
		exe := helperBinary(t, "container")
		dockerUp = exec.Command(exe, "-ping").Run() == nil
	})
	return dockerUp
}

// dockerHinted reports whether anything points at a Docker engine the way
// testcontainers-go looks for one: DOCKER_HOST or its override, a
// testcontainers configuration file, or one of the usual sockets (rootful,
// rootless, Docker Desktop, Podman). Without any of them there is no
// engine to ask, and the helper need not be built.
func dockerHinted(getenv func(string) string, exists func(string) bool, home string) bool {
	for _, v := range []string{"DOCKER_HOST", "TESTCONTAINERS_HOST_OVERRIDE", "TESTCONTAINERS_DOCKER_SOCKET_OVERRIDE"} {
		if getenv(v) != "" {
			return true
		}
	}
	paths := []string{"/var/run/docker.sock", "/run/docker.sock"}
	if d := getenv("XDG_RUNTIME_DIR"); d != "" {
		paths = append(paths, filepath.Join(d, "docker.sock"), filepath.Join(d, "podman", "podman.sock"))
	}
	if home != "" {
		paths = append(paths,
			filepath.Join(home, ".testcontainers.properties"),
			filepath.Join(home, ".docker", "run", "docker.sock"),
			filepath.Join(home, ".docker", "desktop", "docker.sock"))
	}
	for _, p := range paths {
		if exists(p) {
			return true
		}
	}
	return false
}

func fileExists(path string) bool {
	_, err := os.Stat(path)
	return err == nil
}
