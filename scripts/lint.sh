#!/usr/bin/env bash
# lint.sh runs staticcheck, with its default checks, over every module of
# go.work, tests included: code that nothing uses (U1000), deprecated
# calls, values computed and never read. It fails on any finding. make
# test runs it after go vet.
#
# staticcheck is not a dependency of any module: `go run pkg@version`
# builds the pinned version below (verified against the checksum
# database, cached after the first run) outside the workspace's module
# graph. With -warm it only builds it, so that make test finds it in the
# cache (scripts/install-test-deps.sh runs that).
set -euo pipefail
cd "$(dirname "$0")/.."

staticcheck=(go run honnef.co/go/tools/cmd/staticcheck@v0.8.2)

case "${1:-}" in
-warm)
	"${staticcheck[@]}" -version >/dev/null
	exit
	;;
"") ;;
*) echo "usage: $0 [-warm]" >&2; exit 2 ;;
esac

mapfile -t patterns < <(go list -m -f '{{.Dir}}/...')

if ! "${staticcheck[@]}" "${patterns[@]}"; then
	echo "lint: staticcheck found the above (see https://staticcheck.dev/docs/checks)" >&2
	exit 1
fi
echo "lint: staticcheck finds nothing in ${#patterns[@]} modules"
