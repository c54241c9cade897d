# make test is the test command: what the README names and .ci/run calls.
# It installs the servers the tests start (scripts/install-test-deps.sh),
# then vets and runs every test with the race detector. Steps run in this
# order even under make -j.

GO ?= go

.PHONY: test deps vet fuzz soak bench-check

test:
	./scripts/install-test-deps.sh
	$(GO) vet ./...
	$(GO) test -race -count=1 ./...
	$(MAKE) bench-check

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

# soak runs the fault-injection suite (package safety) long: every run
# SOAK times longer, with a fresh seed (printed; DISTLOCK_SAFETY_SEED=n
# reruns one), writing the results table to safety-soak.md. Minutes per
# backend: not part of make test or CI.
SOAK ?= 10
soak:
	./scripts/install-test-deps.sh
	DISTLOCK_SAFETY_SOAK=$(SOAK) DISTLOCK_SAFETY_SEED=$${DISTLOCK_SAFETY_SEED:-$$(date +%s)} \
	DISTLOCK_SAFETY_REPORT=$(CURDIR)/safety-soak.md \
		$(GO) test -race -count=1 -timeout 120m -v ./safety/

# bench/ is its own module (the peers it measures never enter the
# library's dependencies), so ./... above does not reach it: vet and build
# it here, and test its pure parts (no server). Running it is
# `cd bench && go run .` (see bench/RESULTS.md).
bench-check:
	cd bench && $(GO) vet ./... && $(GO) build -o /dev/null . && $(GO) test -race -count=1 ./...
