module github.com/distlock/distlock/testsuite

go 1.26.0

require (
	github.com/distlock/distlock v0.0.0-00010101000000-000000000000
	go.uber.org/goleak v1.3.0
)
