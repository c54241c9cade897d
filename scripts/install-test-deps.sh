#!/usr/bin/env bash
# install-test-deps.sh installs what the tests need and is not a Go module:
# the servers internal/testserver starts (Redis, ZooKeeper, PostgreSQL,
# MariaDB), the network tools fault-injection tests use, and what the race
# detector and make need. It then downloads the Go modules of every module
# in go.work and builds the pinned linter (scripts/lint.sh), so the tests
# themselves need no network.
#
# Idempotent: it installs only what is missing, runs apt-get update only
# then, and says what it did. It uses sudo only when not root. On a system
# without apt-get it checks the binaries and fails naming what is missing.
set -euo pipefail

cd "$(dirname "$0")/.."

# Debian package -> a file it installs that the tests use.
packages=(
	# go test -race needs cgo, so a C compiler and libc's headers; make
	# runs the test command; Go fetches modules over TLS.
	"make:/usr/bin/make"
	"gcc:/usr/bin/gcc"
	"libc6-dev:/usr/include/stdio.h"
	"ca-certificates:/etc/ssl/certs/ca-certificates.crt"
	"redis-server:/usr/bin/redis-server"
	"redis-tools:/usr/bin/redis-cli"
	"zookeeper:/usr/share/java/zookeeper.jar"
	"postgresql:/usr/bin/pg_config"
	"mariadb-server:/usr/sbin/mariadbd"
	"iproute2:/usr/sbin/ip"
	"iptables:/usr/sbin/iptables"
)

say() { printf 'install-test-deps: %s\n' "$*"; }
die() { printf 'install-test-deps: error: %s\n' "$*" >&2; exit 1; }

installed() { # package
	[ "$(dpkg-query -W -f='${Status}' "$1" 2>/dev/null)" = "install ok installed" ]
}

missing=()
if command -v dpkg-query >/dev/null 2>&1; then
	for entry in "${packages[@]}"; do
		pkg=${entry%%:*}
		if installed "$pkg"; then
			say "$pkg: already installed"
		else
			missing+=("$pkg")
		fi
	done
else
	for entry in "${packages[@]}"; do
		pkg=${entry%%:*} file=${entry#*:}
		if [ -e "$file" ] || command -v "$(basename "$file")" >/dev/null 2>&1; then
			say "$pkg: found $(basename "$file")"
		else
			missing+=("$pkg")
		fi
	done
fi

if [ ${#missing[@]} -gt 0 ]; then
	command -v apt-get >/dev/null 2>&1 ||
		die "missing ${missing[*]} and there is no apt-get: install them with your package manager, or set DISTLOCK_TEST_REDIS, DISTLOCK_TEST_POSTGRES, ... to running servers (see internal/testserver)"
	sudo=()
	if [ "$(id -u)" -ne 0 ]; then
		command -v sudo >/dev/null 2>&1 || die "missing ${missing[*]}; not root and no sudo to install them"
		sudo=(sudo)
	fi
	# Keep the packages' maintainer scripts from starting system services:
	# the tests start their own servers on free ports.
	policy=/usr/sbin/policy-rc.d
	if [ ! -e "$policy" ]; then
		printf '#!/bin/sh\nexit 101\n' | "${sudo[@]}" tee "$policy" >/dev/null
		"${sudo[@]}" chmod 755 "$policy"
		trap '"${sudo[@]}" rm -f "$policy"' EXIT
	fi
	say "installing ${missing[*]}"
	"${sudo[@]}" env DEBIAN_FRONTEND=noninteractive apt-get update -q ||
		die "apt-get update failed"
	"${sudo[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "${missing[@]}" ||
		die "apt-get install ${missing[*]} failed"
	for pkg in "${missing[@]}"; do
		installed "$pkg" || die "$pkg is still not installed"
	done
	say "installed ${missing[*]}"
fi

# PostgreSQL's binaries are not on PATH on Debian; testserver finds them
# under /usr/lib/postgresql/*/bin. Check that they are there.
if ! command -v initdb >/dev/null 2>&1 && ! compgen -G '/usr/lib/postgresql/*/bin/initdb' >/dev/null; then
	die "postgresql is installed but initdb is nowhere (PATH, /usr/lib/postgresql/*/bin)"
fi
command -v java >/dev/null 2>&1 || die "zookeeper is installed but java is not on PATH"

command -v go >/dev/null 2>&1 || die "go is not on PATH: install Go (see go.mod for the version)"
# The repository is several modules tied by go.work. Download, for every
# one of them: the modules its go.mod requires (everything its packages and
# tests import, tidy says so), then whatever building and testing them
# together in the workspace selects (go list loads every package and test,
# testserver's helper programs cmd/etcdmember and cmd/container included).
# A bare go mod download in the workspace would fetch the whole module
# graph, modules no package imports included.
say "downloading Go modules (every module of go.work)"
mapfile -t patterns < <(go list -m -f '{{.Dir}}/...')
mapfile -t required < <(for d in $(go list -m -f '{{.Dir}}'); do
	# "require ( path version ... )" blocks and one-line requires.
	awk '/^require \(/ { r = 1; next } r && /^\)/ { r = 0; next } r { print $1 "@" $2 } /^require [^(]/ { print $2 "@" $3 }' "$d/go.mod" |
		grep -v '^github.com/distlock/' || true # the root module requires nothing
done | sort -u)
if [ ${#required[@]} -gt 0 ]; then
	go mod download "${required[@]}"
fi
go list -e -deps -test "${patterns[@]}" >/dev/null
# make test also checks that every go.mod is tidy and measures a user's
# build list; go mod tidy reads the go.mod files of the dependencies' own
# tests. Run both once here so that they find all of it in the cache.
say "warming the module cache for scripts/tidy.sh -check, scripts/deps.go and scripts/lint.sh"
./scripts/tidy.sh -check >/dev/null 2>&1 || true
go run scripts/deps.go -warm >/dev/null 2>&1 || true
./scripts/lint.sh -warm
say "done"
