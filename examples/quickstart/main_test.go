package main

import "testing"

// The README's first command must keep working: run the whole program.
func TestQuickstart(t *testing.T) {
	if err := run(t.Context()); err != nil {
		t.Fatal(err)
	}
}
