#!/usr/bin/env bash
# check-format.sh fails if a Go file of the repository is not gofmt'ed.
# make test runs it.
set -euo pipefail
cd "$(dirname "$0")/.."
unformatted=$(gofmt -l $(git ls-files '*.go' 2>/dev/null || find . -name '*.go' -not -path './.git/*'))
if [ -n "$unformatted" ]; then
	printf 'check-format: not gofmt'"'"'ed (run gofmt -w):\n%s\n' "$unformatted" >&2
	exit 1
fi
echo "check-format: every Go file is gofmt'ed"
