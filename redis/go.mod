module github.com/distlock/distlock/redis

go 1.26.0

require (
	github.com/distlock/distlock v0.0.0-00010101000000-000000000000
	github.com/distlock/distlock/internal/redisscript v0.0.0-00010101000000-000000000000
	github.com/distlock/distlock/internal/testserver v0.0.0-00010101000000-000000000000
	github.com/distlock/distlock/testsuite v0.0.0-00010101000000-000000000000
	github.com/redis/go-redis/v9 v9.23.0
	go.uber.org/goleak v1.3.0
)

require (
	github.com/cespare/xxhash/v2 v2.3.0 // indirect
	go.uber.org/atomic v1.12.0 // indirect
	golang.org/x/sys v0.49.0 // indirect
)
