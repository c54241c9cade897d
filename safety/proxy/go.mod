module github.com/distlock/distlock/safety/proxy

go 1.26.0
