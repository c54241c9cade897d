package testserver

import (
	"fmt"
	"os"
	"strings"
	"testing"
)

// source is where a server for a test comes from.
type source int

const (
	sourceEnv    source = iota // an address in an environment variable
	sourceBinary               // a local binary started by the test
	sourceDocker               // a container started with testcontainers-go
	sourceSkip                 // none available: skip the test
	sourceFail                 // none available and CI is set: fail the test
)

func (s source) String() string {
	switch s {
	case sourceEnv:
		return "env"
	case sourceBinary:
		return "binary"
	case sourceDocker:
		return "docker"
	case sourceSkip:
		return "skip"
	case sourceFail:
		return "fail"
	}
	return fmt.Sprintf("source(%d)", int(s))
}

// pickSource is the whole selection policy: an address in the environment
// wins, then a local binary, then a Docker engine; when none is available
// the test skips, or fails when running in CI.
func pickSource(envAddr string, haveBinary, haveDocker, ci bool) source {
	switch {
	case envAddr != "":
		return sourceEnv
	case haveBinary:
		return sourceBinary
	case haveDocker:
		return sourceDocker
	case ci:
		return sourceFail
	default:
		return sourceSkip
	}
}

// inCI reports whether the CI environment variable asks for strictness.
func inCI() bool {
	switch strings.ToLower(strings.TrimSpace(os.Getenv("CI"))) {
	case "", "0", "false", "no":
		return false
	}
	return true
}

// kind describes one sort of server for source selection and messages.
type kind struct {
	name    string // "redis"
	envVar  string // "DISTLOCK_TEST_REDIS"
	binary  string // what was looked for, for the message ("redis-server")
	install string // how to install it ("apt-get install redis-server")
	image   string // official Docker image, "" when there is none
}

// choose decides where the server for t comes from. haveBinary says whether
// the local binary was found. On sourceSkip and sourceFail it ends the test
// with a message naming the missing binary and how to install it.
func (k kind) choose(t testing.TB, haveBinary bool) (source, string) {
	t.Helper()
	env := strings.TrimSpace(os.Getenv(k.envVar))
	docker := false
	if env == "" && !haveBinary && k.image != "" {
		docker = dockerAvailable(t)
	}
	src := pickSource(env, haveBinary, docker, inCI())
	switch src {
	case sourceSkip, sourceFail:
		unavailable(t, src == sourceFail, "%s not found (install it with scripts/install-test-deps.sh or `%s`), no Docker engine answers, and %s is not set to the address of a running server",
			k.binary, k.install, k.envVar)
	}
	return src, env
}

// unavailable ends the test because something it needs cannot be had:
// it fails when fail is set (CI), else it skips with the reason.
func unavailable(t testing.TB, fail bool, format string, args ...any) {
	t.Helper()
	msg := "testserver: " + fmt.Sprintf(format, args...)
	if fail {
		t.Fatal(msg + " (failing because CI is set)")
	}
	t.Skip(msg)
}

// notControllable ends a test that wants to stop, kill or pause a server
// it did not start: one named by an environment variable, or a container.
func notControllable(t testing.TB, what, envVar string) {
	t.Helper()
	unavailable(t, inCI(), "cannot %s a server the test did not start (given by %s, or a Docker container); unset %s and install the server to let the test start its own", what, envVar, envVar)
}
