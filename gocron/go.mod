module github.com/distlock/distlock/gocron

go 1.26.0

require (
	github.com/distlock/distlock v0.0.0-00010101000000-000000000000
	github.com/go-co-op/gocron/v2 v2.21.2
)

require (
	github.com/google/uuid v1.6.0 // indirect
	github.com/jonboulle/clockwork v0.5.0 // indirect
	github.com/robfig/cron/v3 v3.0.1 // indirect
)
