module github.com/distlock/distlock/zookeeper

go 1.26.0

require (
	github.com/distlock/distlock v0.0.0-00010101000000-000000000000
	github.com/distlock/distlock/internal/testserver v0.0.0-00010101000000-000000000000
	github.com/distlock/distlock/testsuite v0.0.0-00010101000000-000000000000
	github.com/go-zookeeper/zk v1.0.4
	go.uber.org/goleak v1.3.0
)
