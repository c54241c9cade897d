# make test is the test command: what the README names and .ci/run calls.
# It installs the servers the tests start (scripts/install-test-deps.sh),
# then vets and runs every test with the race detector. Steps run in this
# order even under make -j.

GO ?= go

.PHONY: test deps vet bench-check

test:
	./scripts/install-test-deps.sh
	$(GO) vet ./...
	$(GO) test -race -count=1 ./...
	$(MAKE) bench-check

deps:
	./scripts/install-test-deps.sh

vet:
	$(GO) vet ./...

# bench/ is its own module (the peers it measures never enter the
# library's dependencies), so ./... above does not reach it: vet and build
# it here, and test its pure parts (no server). Running it is
# `cd bench && go run .` (see bench/RESULTS.md).
bench-check:
	cd bench && $(GO) vet ./... && $(GO) build -o /dev/null . && $(GO) test -race -count=1 ./...
