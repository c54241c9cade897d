#!/usr/bin/env bash
# release.sh VERSION prepares the release commit of every module at
# VERSION (vMAJOR.MINOR.PATCH) and prints the tags to make, in dependency
# order. It changes files only; committing, tagging and pushing are yours.
#
# 1. Every requirement between the repository's modules, and go.work's
#    replace lines, move from their current version to VERSION.
# 2. scripts/tidy.sh -check confirms every go.mod is still tidy.
# 3. It prints one tag per module users may require, each after the
#    modules it requires: push them in that order, so that no module's
#    version is visible before those it needs. examples, safety and bench
#    are never tagged: nothing requires them.
set -euo pipefail
cd "$(dirname "$0")/.."

version=${1:-}
if ! [[ $version =~ ^v[0-9]+\.[0-9]+\.[0-9]+$ ]]; then
	echo "usage: $0 vMAJOR.MINOR.PATCH" >&2
	exit 2
fi
root=github.com/distlock/distlock
untagged=" $root/examples $root/safety $root/bench "

mapfile -t mods < <(go list -m -f '{{.Path}} {{.Dir}}')
declare -A dir deps
for m in "${mods[@]}"; do
	dir[${m%% *}]=${m#* }
done

# local_requires prints the repository's modules that the go.mod in $1
# requires.
local_requires() {
	awk '/^require \(/ { r = 1; next } r && /^\)/ { r = 0; next } r { print $1 } /^require [^(]/ { print $2 }' "$1/go.mod" |
		grep -E "^$root(/|\$)" || true
}

for path in "${!dir[@]}"; do
	d=${dir[$path]}
	deps[$path]=$(local_requires "$d" | tr '\n' ' ')
	edits=()
	for req in ${deps[$path]}; do
		edits+=("-require=$req@$version")
	done
	if [ ${#edits[@]} -gt 0 ]; then
		go mod edit "${edits[@]}" "$d/go.mod"
	fi
done

# go.work: its replace lines ("<path> <version> => <dir>") for the
# repository's modules, at the new version (edited as text: go work edit
# would drop the file's comments).
sed -E -i "s#^([[:space:]]*(replace[[:space:]]+)?$root(/[^[:space:]]*)?)[[:space:]]+v[^[:space:]]+[[:space:]]+=>#\1 $version =>#" go.work

./scripts/tidy.sh -check

# Tags in dependency order: a module after every module it requires.
declare -A done
order=()
while [ ${#order[@]} -lt ${#dir[@]} ]; do
	progress=false
	for path in $(printf '%s\n' "${!dir[@]}" | sort); do
		[ -n "${done[$path]:-}" ] && continue
		ready=true
		for req in ${deps[$path]}; do
			[ -n "${done[$req]:-}" ] || ready=false
		done
		if $ready; then
			done[$path]=1
			order+=("$path")
			progress=true
		fi
	done
	$progress || { echo "release: the modules require each other in a cycle" >&2; exit 1; }
done

echo
echo "Commit, then tag that commit and push the tags in this order:"
for path in "${order[@]}"; do
	case "$untagged" in *" $path "*) continue ;; esac
	if [ "$path" = "$root" ]; then tag=$version; else tag=${path#"$root/"}/$version; fi
	echo "  git tag $tag && git push origin $tag"
done
