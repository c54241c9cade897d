#!/usr/bin/env bash
# check-tracked.sh fails if git tracks what a build produces: a file over
# 1 MiB, or an executable binary (ELF, Mach-O, PE or WebAssembly, or any
# file with the executable bit that holds a NUL byte; scripts are text).
# make test runs it. Outside a git checkout it has nothing to check.
set -euo pipefail
cd "$(dirname "$0")/.."

say() { printf 'check-tracked: %s\n' "$*"; }

if ! git rev-parse --is-inside-work-tree >/dev/null 2>&1; then
	say "not a git checkout: nothing to check"
	exit 0
fi

limit=$((1024 * 1024))
bad=0
n=0
# -s: "<mode> <object> <stage>\t<path>", NUL-terminated.
while IFS= read -r -d '' entry; do
	mode=${entry%% *}
	path=${entry#*$'\t'}
	[ -f "$path" ] || continue # deleted in the work tree: not committed as is
	n=$((n + 1))
	size=$(stat -c %s "$path")
	if [ "$size" -gt "$limit" ]; then
		say "$path: $size bytes, over 1 MiB: a build output or data that belongs elsewhere"
		bad=1
		continue
	fi
	magic=$(LC_ALL=C head -c 4 "$path" | od -An -tx1 | tr -d ' \n')
	case "$magic" in
	7f454c46 | cafebabe | feedface | feedfacf | cefaedfe | cffaedfe | 0061736d | 4d5a*)
		say "$path: an executable binary (magic $magic)"
		bad=1
		continue
		;;
	esac
	if [ "$mode" = 100755 ] && [ "$(LC_ALL=C tr -d '\000' <"$path" | wc -c)" -ne "$size" ]; then
		say "$path: executable and not text"
		bad=1
	fi
done < <(git ls-files -s -z)

if [ "$bad" -ne 0 ]; then
	say "untrack them (git rm --cached) and ignore them in .gitignore"
	exit 1
fi
say "$n tracked files: none over 1 MiB, no executable binary"
