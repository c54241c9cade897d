# make test is the test command: what the README names and .ci/run calls.
# It installs the servers the tests start (scripts/install-test-deps.sh),
# then vets and runs every test with the race detector. Steps run in this
# order even under make -j.

GO ?= go

.PHONY: test deps vet fuzz

test:
	./scripts/install-test-deps.sh
	$(GO) vet ./...
	$(GO) test -race -count=1 ./...

deps:
	./scripts/install-test-deps.sh

vet:
	$(GO) vet ./...

# fuzz runs each fuzz target for FUZZTIME (make test runs only their seed
# corpora). One target per go test call: that is all -fuzz takes.
FUZZTIME ?= 30s
FUZZ = $(GO) test -run '^$$' -fuzztime $(FUZZTIME) -fuzz

fuzz:
	$(FUZZ) '^FuzzTryLock$$' .
	$(FUZZ) '^FuzzOptions$$' .
	$(FUZZ) '^FuzzLayout$$' ./internal/redisscript
	$(FUZZ) '^FuzzEncodeKey$$' ./etcd
	$(FUZZ) '^FuzzEncodeKey$$' ./zookeeper
