package safety

import (
	"testing"

	"github.com/distlock/distlock/redis"
	"github.com/distlock/distlock/redlock"
)

// TestRedisStoresNameKeysAlike: the Redis and Redlock stores share the
// key layout's default prefix and key limit, so that a lock key is named
// alike on both.
func TestRedisStoresNameKeysAlike(t *testing.T) {
	if redlock.DefaultPrefix != redis.DefaultPrefix {
		t.Errorf("redlock.DefaultPrefix = %q; want redis's %q", redlock.DefaultPrefix, redis.DefaultPrefix)
	}
	if redlock.MaxKeyLen != redis.MaxKeyLen {
		t.Errorf("redlock.MaxKeyLen = %d; want redis's %d", redlock.MaxKeyLen, redis.MaxKeyLen)
	}
}
