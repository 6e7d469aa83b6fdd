#!/usr/bin/env bash
# Rebuilds every guest fixture (scripts/build-wasm.sh) into a temporary directory and fails,
# listing the files, if a committed .wasm differs from its rebuilt version, if a rebuilt module
# is not committed, or if a committed fixture has no source any more.
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

"$root/scripts/build-wasm.sh" --out "$tmp" >/dev/null

bad=()
while IFS= read -r f; do
	f=${f#"$tmp"/}
	if ! git ls-files --error-unmatch "$f" >/dev/null 2>&1; then
		bad+=("$f: built from source but not committed")
	elif ! cmp -s "$tmp/$f" "$f"; then
		bad+=("$f: differs from a fresh build (run scripts/build-wasm.sh and commit)")
	fi
done < <(find "$tmp" -name '*.wasm' | sort)
while IFS= read -r f; do
	[ -f "$tmp/$f" ] || bad+=("$f: committed, but no source builds it")
done < <(git ls-files 'examples/wasm/*.wasm' 'guest-sdk/testdata/*.wasm')

if [ ${#bad[@]} -gt 0 ]; then
	echo "check-wasm: ${#bad[@]} fixture(s) out of date:" >&2
	printf '  %s\n' "${bad[@]}" >&2
	exit 1
fi
echo "check-wasm: $(find "$tmp" -name '*.wasm' | wc -l) fixtures match their sources"
