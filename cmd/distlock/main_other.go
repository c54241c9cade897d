//go:build !unix

// Command distlock runs a program while holding a distributed lock. It
// needs process groups and signals: it runs on Linux and the other Unix
// systems only.
package main

import (
	"fmt"
	"os"
)

func main() {
	fmt.Fprintln(os.Stderr, "distlock: this command runs on Linux and the other Unix systems only")
	os.Exit(2)
}
