# make test is the test command: what the README names and .ci/run calls.
# It installs the servers the tests start (scripts/install-test-deps.sh),
# checks that nothing a build makes is tracked, that every Go file is
# gofmt'ed and that every go.mod is tidy, then vets and lints (staticcheck:
# dead code among others, scripts/lint.sh) and runs every test of
# every module with the race detector (and, without it, the one ZooKeeper
# test that go-zookeeper's own data race on reconnects would fail under
# it: see zookeeper/stall_random_test.go), and checks what an application
# using one store gets in its build list. Steps run in this order even under make -j.
#
# The repository is several modules tied by go.work (see "Modules" in the
# README). ./... in the root does not reach the nested modules, so the
# commands name every module's directory: one go command over all of them
# keeps the packages running in parallel and fails if any module fails.

GO ?= go

# Every module of the workspace as a package pattern: /path/to/module/...
MODULES = $(shell $(GO) list -m -f '{{.Dir}}/...')

.PHONY: test deps check-tracked check-format tidy tidy-check vet lint deps-table deps-check fuzz soak bench-check

test:
	./scripts/install-test-deps.sh
	./scripts/check-tracked.sh
	./scripts/check-format.sh
	./scripts/tidy.sh -check
	$(GO) vet $(MODULES)
	$(GO) vet scripts/deps.go
	./scripts/lint.sh
	$(GO) test -race -count=1 -timeout 30m $(MODULES)
	$(GO) test -count=1 -run '^TestRandomizedStalls$$' ./zookeeper/
	$(GO) run scripts/deps.go -check
	$(MAKE) bench-check

deps:
	./scripts/install-test-deps.sh

check-tracked:
	./scripts/check-tracked.sh

check-format:
	./scripts/check-format.sh

# tidy runs go mod tidy in every module, against the local copies of the
# others; tidy-check fails if that would change anything, or if the root
# module requires anything.
tidy:
	./scripts/tidy.sh

tidy-check:
	./scripts/tidy.sh -check

vet:
	$(GO) vet $(MODULES)
	$(GO) vet scripts/deps.go

# lint runs staticcheck's default checks over every module, tests
# included, and fails on any finding: unused code among others.
lint:
	./scripts/lint.sh

# deps-table prints, for an application that imports the facade and one
# store, the modules in its build list and the lines of its go.sum, as if
# the modules were published as they are here (the README's table).
# deps-check fails when the Redis store's exceed 20 modules or 45 lines,
# or when the root module brings any module at all.
deps-table:
	$(GO) run scripts/deps.go -v

deps-check:
	$(GO) run scripts/deps.go -check

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

# bench-check links the programs no test runs: the bench (running it is
# `cd bench && go run .`, see bench/RESULTS.md), the examples, and
# testserver's helpers (cmd/container takes the Docker path only). make
# test has vetted and tested their packages already. It then counts what
# an uncontended Redis, PostgreSQL, etcd and ZooKeeper lock+unlock costs (server commands, allocations,
# goroutines created, goroutine blocks, timers: counts, not times), fenced
# as by default, and fails when a count
# rises above its target (bench/counts_test.go); and the heap 20,000 locks
# held at once cost per lock on each store, which fails above its target
# (bench/held_test.go), each store in a process of its own: memory the
# stores measured before it free late would be counted against it (etcd
# read 184 B per lock after three other stores, 273 B alone).
bench-check:
	$(GO) build -o /dev/null ./bench ./examples/... ./internal/testserver/cmd/...
	$(GO) test -count=1 -run '^$$' -bench '^BenchmarkCycleCounts$$/^(redis|postgres|etcd|zookeeper)$$' -benchtime 2000x ./bench
	for s in redis postgres etcd zookeeper; do \
		$(GO) test -count=1 -run '^$$' -bench "^BenchmarkHeldHeap\$$/^$$s\$$" -benchtime 20000x ./bench || exit 1; \
	done
