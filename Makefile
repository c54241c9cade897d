# make test is the test command: what the README names and .ci/run calls.
# It installs the servers the tests start (scripts/install-test-deps.sh),
# then vets and runs every test with the race detector. Steps run in this
# order even under make -j.

GO ?= go

.PHONY: test deps vet

test:
	./scripts/install-test-deps.sh
	$(GO) vet ./...
	$(GO) test -race -count=1 ./...

deps:
	./scripts/install-test-deps.sh

vet:
	$(GO) vet ./...
