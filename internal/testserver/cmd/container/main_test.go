package main

import (
	"os"
	"path/filepath"
	"testing"
)

func TestEnvList(t *testing.T) {
	e := envList{}
	for _, s := range []string{"A=1", "B=", "C=x=y"} {
		if err := e.Set(s); err != nil {
			t.Fatalf("Set(%q): %v", s, err)
		}
	}
	if e["A"] != "1" || e["B"] != "" || e["C"] != "x=y" || len(e) != 3 {
		t.Fatalf("envList = %v; want A=1, B=, C=x=y", e)
	}
	for _, bad := range []string{"", "novalue", "=v"} {
		if err := e.Set(bad); err == nil {
			t.Errorf("Set(%q) = nil; want an error", bad)
		}
	}
}

func TestWriteAddr(t *testing.T) {
	path := filepath.Join(t.TempDir(), "addr")
	if err := writeAddr(path, hostPort(49153)); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(path)
	if err != nil || string(b) != "127.0.0.1:49153\n" {
		t.Fatalf("address file = %q, %v; want 127.0.0.1:49153", b, err)
	}
}
