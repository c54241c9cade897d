#!/usr/bin/env bash
# tidy.sh runs `go mod tidy` in every module of the repository (those
# go.work uses), each against the local copies of the others, and writes
# their go.mod and go.sum. With -check it writes nothing and fails if a
# go.mod or go.sum is not tidy, or if the root module requires anything
# (make test runs it so).
#
# The modules require each other at v0.0.0-00010101000000-000000000000;
# go.work resolves them to the local directories in development. go mod
# tidy ignores go.work, so this script tidies a copy of each go.mod
# (-modfile) with temporary replace directives to the local directories,
# then drops them: no go.mod in the repository keeps a replace. A release
# sets those requirements to tagged versions instead: see "Modules" in the
# README.
set -euo pipefail
cd "$(dirname "$0")/.."

check=false
case "${1:-}" in
-check) check=true ;;
"") ;;
*) echo "usage: $0 [-check]" >&2; exit 2 ;;
esac

say() { printf 'tidy: %s\n' "$*"; }

mapfile -t mods < <(go list -m -f '{{.Path}} {{.Dir}}')
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

replaces=() drops=()
for m in "${mods[@]}"; do
	replaces+=("-replace=${m%% *}=${m#* }")
	drops+=("-dropreplace=${m%% *}")
done

# tidy_one tidies the module at dir into $work/go.mod and $work/go.sum.
tidy_one() { # path dir work
	local path=$1 dir=$2 work=$3
	mkdir -p "$work"
	cp "$dir/go.mod" "$work/go.mod"
	if [ -f "$dir/go.sum" ]; then cp "$dir/go.sum" "$work/go.sum"; else : >"$work/go.sum"; fi
	# A module replacing itself is an error: leave its own path out.
	local own=() r
	for r in "${replaces[@]}"; do
		[ "${r%%=*}" = "-replace" ] || true
		case "$r" in "-replace=$path="*) ;; *) own+=("$r") ;; esac
	done
	go mod edit -modfile="$work/go.mod" "${own[@]}"
	(cd "$dir" && GOWORK=off GOFLAGS=-mod=mod go mod tidy -modfile="$work/go.mod")
	go mod edit -modfile="$work/go.mod" "${drops[@]}"
}

status=0
# Each module's graph includes the requirements of the local modules it
# requires, so one pass may change what the next needs: two passes.
passes=2
$check && passes=1
for pass in $(seq "$passes"); do
	for m in "${mods[@]}"; do
		path=${m%% *} dir=${m#* }
		work="$tmp/$pass/${path//\//_}"
		tidy_one "$path" "$dir" "$work"
		if $check; then
			for f in go.mod go.sum; do
				have="$dir/$f"
				[ -f "$have" ] || have=/dev/null
				if ! diff -u "$have" "$work/$f" >"$tmp/diff" 2>&1; then
					# An empty go.sum and no go.sum are the same.
					if [ "$f" = go.sum ] && [ ! -s "$work/$f" ] && [ "$have" = /dev/null ]; then
						continue
					fi
					say "$dir/$f is not tidy (run scripts/tidy.sh):"
					sed 's/^/    /' "$tmp/diff"
					status=1
				fi
			done
		else
			cp "$work/go.mod" "$dir/go.mod"
			if [ -s "$work/go.sum" ]; then cp "$work/go.sum" "$dir/go.sum"; else rm -f "$dir/go.sum"; fi
		fi
	done
done

# The root module's users get nothing but the standard library.
root=$(go list -m -f '{{.Dir}}' github.com/distlock/distlock)
if go mod edit -json "$root/go.mod" | grep -q '"Require": \['; then
	say "the root module requires modules: it must need only the standard library, tests included"
	sed -n '/^require/,/^)/p' "$root/go.mod" | sed 's/^/    /'
	status=1
fi
if [ "$status" -eq 0 ]; then
	if $check; then say "every go.mod and go.sum is tidy; the root module requires nothing"; else say "done"; fi
fi
exit "$status"
