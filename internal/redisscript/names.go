package redisscript

import (
	"errors"
	"fmt"
)

// DefaultPrefix is the key prefix of the Redis stores (redis and
// redlock) unless their WithPrefix says otherwise, so a lock key is named
// alike on both.
const DefaultPrefix = "distlock:"

// MaxKeyLen is the longest lock key, in bytes, the Redis stores accept.
// Redis itself takes keys up to 512 MB; a lock name is short, and a
// longer one is almost surely a mistake (a payload passed as a key).
const MaxKeyLen = 64 << 10

// ValidateKey rejects an empty key and one longer than MaxKeyLen bytes,
// naming store (its package) in the error. Any bytes are allowed, braces
// included.
func ValidateKey(store, key string) error {
	switch {
	case key == "":
		return errors.New(store + ": empty key")
	case len(key) > MaxKeyLen:
		return fmt.Errorf("%s: key of %d bytes is longer than %d", store, len(key), MaxKeyLen)
	}
	return nil
}
