package testserver

import (
	"fmt"
	"runtime"
	"strings"
	"testing"
)

func TestPickSource(t *testing.T) {
	tests := []struct {
		env                string
		binary, docker, ci bool
		want               source
	}{
		{env: "127.0.0.1:1", binary: true, docker: true, ci: true, want: sourceEnv},
		{env: "127.0.0.1:1", want: sourceEnv},
		{binary: true, docker: true, ci: true, want: sourceBinary},
		{binary: true, want: sourceBinary},
		{docker: true, ci: true, want: sourceDocker},
		{docker: true, want: sourceDocker},
		{ci: true, want: sourceFail},
		{want: sourceSkip},
	}
	for _, tt := range tests {
		got := pickSource(tt.env, tt.binary, tt.docker, tt.ci)
		if got != tt.want {
			t.Errorf("pickSource(%q, binary=%v, docker=%v, ci=%v) = %v; want %v",
				tt.env, tt.binary, tt.docker, tt.ci, got, tt.want)
		}
	}
}

func TestInCI(t *testing.T) {
	for v, want := range map[string]bool{"": false, "0": false, "false": false, "true": true, "1": true, "yes": true} {
		t.Setenv("CI", v)
		if got := inCI(); got != want {
			t.Errorf("CI=%q: inCI() = %v; want %v", v, got, want)
		}
	}
}

func TestDockerHinted(t *testing.T) {
	none := func(string) bool { return false }
	only := func(want string) func(string) bool { return func(p string) bool { return p == want } }
	env := func(kv ...string) func(string) string {
		return func(k string) string {
			for i := 0; i+1 < len(kv); i += 2 {
				if kv[i] == k {
					return kv[i+1]
				}
			}
			return ""
		}
	}
	tests := []struct {
		name   string
		getenv func(string) string
		exists func(string) bool
		home   string
		want   bool
	}{
		{"nothing", env(), none, "/home/u", false},
		{"nothing, no home", env(), none, "", false},
		{"DOCKER_HOST", env("DOCKER_HOST", "tcp://10.0.0.1:2375"), none, "", true},
		{"override", env("TESTCONTAINERS_HOST_OVERRIDE", "10.0.0.1"), none, "", true},
		{"rootful socket", env(), only("/var/run/docker.sock"), "", true},
		{"rootless socket", env("XDG_RUNTIME_DIR", "/run/user/1000"), only("/run/user/1000/docker.sock"), "", true},
		{"podman socket", env("XDG_RUNTIME_DIR", "/run/user/1000"), only("/run/user/1000/podman/podman.sock"), "", true},
		{"XDG socket without XDG_RUNTIME_DIR", env(), only("/run/user/1000/docker.sock"), "", false},
		{"desktop socket", env(), only("/home/u/.docker/run/docker.sock"), "/home/u", true},
		{"properties file", env(), only("/home/u/.testcontainers.properties"), "/home/u", true},
	}
	for _, tt := range tests {
		if got := dockerHinted(tt.getenv, tt.exists, tt.home); got != tt.want {
			t.Errorf("%s: dockerHinted = %v; want %v", tt.name, got, tt.want)
		}
	}
}

// recordTB records how a test ended instead of ending it.
type recordTB struct {
	testing.TB
	skipped, failed string
}

func (r *recordTB) Helper() {}
func (r *recordTB) Skip(args ...any) {
	r.skipped = fmt.Sprint(args...)
	runtime.Goexit()
}
func (r *recordTB) Fatal(args ...any) {
	r.failed = fmt.Sprint(args...)
	runtime.Goexit()
}

// run runs f with r in a goroutine of its own, as testing does, so that
// Skip and Fatal can end it.
func (r *recordTB) run(f func()) {
	done := make(chan struct{})
	go func() {
		defer close(done)
		f()
	}()
	<-done
}

func TestChooseMissingBinary(t *testing.T) {
	k := kind{name: "demo", envVar: "DISTLOCK_TEST_DEMO", binary: "demo-server", install: "apt-get install demo"}
	t.Setenv(k.envVar, "")

	t.Setenv("CI", "")
	r := &recordTB{TB: t}
	r.run(func() { k.choose(r, false) })
	for _, want := range []string{"demo-server", "apt-get install demo", "scripts/install-test-deps.sh", k.envVar} {
		if !strings.Contains(r.skipped, want) {
			t.Errorf("skip message %q does not name %q", r.skipped, want)
		}
	}
	if r.failed != "" {
		t.Errorf("failed without CI: %q", r.failed)
	}

	t.Setenv("CI", "true")
	r = &recordTB{TB: t}
	r.run(func() { k.choose(r, false) })
	if r.failed == "" || r.skipped != "" || !strings.Contains(r.failed, "demo-server") {
		t.Errorf("with CI set: failed %q, skipped %q; want a failure naming demo-server", r.failed, r.skipped)
	}

	t.Setenv(k.envVar, "127.0.0.1:1")
	r = &recordTB{TB: t}
	var src source
	var addr string
	r.run(func() { src, addr = k.choose(r, false) })
	if src != sourceEnv || addr != "127.0.0.1:1" || r.failed != "" || r.skipped != "" {
		t.Errorf("with %s set: choose = %v, %q (failed %q, skipped %q); want env, 127.0.0.1:1", k.envVar, src, addr, r.failed, r.skipped)
	}
}
