package testserver

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"sync"
	"syscall"
	"testing"
)

// Helper programs. What needs a heavy dependency runs in a program of its
// own under cmd/, built from this module's source when a test first needs
// it: cmd/etcdmember (an etcd member, go.etcd.io/etcd/server/v3/embed) and
// cmd/container (a container, testcontainers-go). This package itself
// imports only the standard library, so a module whose tests import it
// (every store's) lists none of those dependencies in its go.mod, and
// neither does the build list of an application using that store.

var helpers sync.Map // name -> *helperBuild

type helperBuild struct {
	once sync.Once
	path string
	err  error
}

// helperBinary returns the path of the helper program cmd/name, built once
// per test binary with the go command that runs the tests. It fails t if
// the build fails.
func helperBinary(t testing.TB, name string) string {
	t.Helper()
	v, _ := helpers.LoadOrStore(name, &helperBuild{})
	b := v.(*helperBuild)
	b.once.Do(func() { b.path, b.err = buildHelper(name) })
	if b.err != nil {
		t.Fatalf("testserver: %v", b.err)
	}
	return b.path
}

// buildHelper builds cmd/name of this module into a per-user cache
// directory and returns the binary's path. Test binaries running at the
// same time share the build: a lock file orders them, and the binary is
// renamed into place, so a running helper is never overwritten.
func buildHelper(name string) (string, error) {
	src, err := helperSource(name)
	if err != nil {
		return "", err
	}
	// go test puts its own GOROOT/bin first on the test's PATH.
	goBin, err := exec.LookPath("go")
	if err != nil {
		return "", fmt.Errorf("build helper %s: the go command is needed to build it: %v", name, err)
	}
	dir, err := helperCacheDir()
	if err != nil {
		return "", err
	}
	lock, err := os.OpenFile(filepath.Join(dir, name+".lock"), os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		return "", err
	}
	defer lock.Close()
	if err := syscall.Flock(int(lock.Fd()), syscall.LOCK_EX); err != nil {
		return "", fmt.Errorf("build helper %s: lock: %w", name, err)
	}
	defer syscall.Flock(int(lock.Fd()), syscall.LOCK_UN)

	out := filepath.Join(dir, name)
	tmp := out + ".new." + strconv.Itoa(os.Getpid())
	cmd := exec.Command(goBin, "build", "-o", tmp, ".")
	cmd.Dir = src
	var stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stderr, &stderr
	if err := cmd.Run(); err != nil {
		os.Remove(tmp)
		return "", fmt.Errorf("build helper %s in %s: %v:\n%s", name, src, err, stderr.Bytes())
	}
	if err := os.Rename(tmp, out); err != nil {
		os.Remove(tmp)
		return "", err
	}
	return out, nil
}

// helperSource returns the directory of cmd/name, next to this file.
func helperSource(name string) (string, error) {
	_, file, _, ok := runtime.Caller(0)
	if !ok || !filepath.IsAbs(file) {
		return "", fmt.Errorf("build helper %s: cannot locate testserver's source (built with -trimpath?)", name)
	}
	dir := filepath.Join(filepath.Dir(file), "cmd", name)
	if _, err := os.Stat(filepath.Join(dir, "main.go")); err != nil {
		return "", fmt.Errorf("build helper %s: %w", name, err)
	}
	return dir, nil
}

// helperCacheDir returns the directory the helpers are built into: under
// the user's cache directory, else under the temp dir, per user.
func helperCacheDir() (string, error) {
	base, err := os.UserCacheDir()
	if err != nil {
		base = filepath.Join(os.TempDir(), "distlock-"+strconv.Itoa(os.Getuid()))
	}
	dir := filepath.Join(base, "distlock", "testserver")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", err
	}
	return dir, nil
}
