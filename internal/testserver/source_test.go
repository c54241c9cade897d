package testserver

import "testing"

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
