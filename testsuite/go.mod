module github.com/distlock/distlock/testsuite

go 1.26.0

require (
	github.com/distlock/distlock v0.0.0-00010101000000-000000000000
	github.com/distlock/distlock/metrics v0.0.0-00010101000000-000000000000
	go.uber.org/goleak v1.3.0
	pgregory.net/rapid v1.3.0
)

require (
	github.com/cespare/xxhash/v2 v2.3.0 // indirect
	go.opentelemetry.io/otel v1.47.0 // indirect
	go.opentelemetry.io/otel/metric v1.47.0 // indirect
)
