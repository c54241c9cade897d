// Package owner makes owner values: the string a lock holder stores under
// its key so that only it can release or extend the lock.
package owner

import (
	"crypto/rand"
	"encoding/hex"
)

// New returns 128 random bits as 32 lowercase hex characters: fresh for
// every acquisition and, with overwhelming probability, unique across
// processes and machines.
func New() string {
	var b [16]byte
	rand.Read(b[:]) // never returns an error; it crashes the program if the OS fails it
	var h [32]byte
	hex.Encode(h[:], b[:])
	return string(h[:])
}
