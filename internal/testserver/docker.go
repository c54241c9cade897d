package testserver

import "testing"

// dockerRun starts k's image and returns the host address of its port.
func dockerRun(t testing.TB, k kind, port int, env []string) string {
	t.Helper()
	t.Fatalf("testserver: docker fallback for %s not implemented yet", k.name)
	return ""
}
