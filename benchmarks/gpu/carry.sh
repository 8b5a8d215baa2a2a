#!/usr/bin/env bash
# What each call of the plan (README.md, "The calls") sends, in MiB, against the device's 64: the working
# tree that travels (tracked files, and untracked ones git does not ignore) and the call's .whl folders.
# A call over the limit is refused before it starts, so check here, at no device time:
#   bash benchmarks/gpu/carry.sh      # exits 1 when a call is over
set -uo pipefail
cd "$(dirname "$0")/../.."
# the one call of a lean tree (lean.sh on: docs/bench stays behind), then the three of the whole tree
lean_call="core base lance-1 lance-2 cache"
calls=("core base lance-1" "core base lance-2" "core base cache")
LIMIT=$((64 * 1024 * 1024))
mib() { awk -v b="$1" 'BEGIN {printf "%.1f", b / 1048576}'; }
git rev-parse --git-dir >/dev/null 2>&1 || { echo "carry: $PWD is not a git checkout: the tree that travels is unknown"; exit 1; }
# one du over the whole list (its total is the last line); -b counts a link as a link, as it travels, -l
# a hard-linked file each time; a file deleted but still tracked counts nothing
tree_bytes() {  # the files that travel, less those under $1 (a path prefix; empty: none left out)
  (git ls-files -z --cached --others --exclude-standard; [ -d shared ] && find shared -type f -print0) |
    { if [ -n "$1" ]; then grep -zv "^$1"; else cat; fi; } | du -cbl --files0-from=- 2>/dev/null | tail -n 1 | cut -f1
}
over=0
check() {  # name, tree bytes, folders
  local name=$1 total=$2 verdict=ok folder
  for folder in $3; do
    if [ ! -d ".whl/$folder" ]; then
      echo "$name: .whl/$folder is missing: bash benchmarks/gpu/wheels.sh"; verdict=INCOMPLETE over=1; continue
    fi
    total=$(( total + $(du -sbl ".whl/$folder" | cut -f1) ))
  done
  (( total > LIMIT )) && { verdict="OVER: carry less or shrink the tree"; over=1; }
  echo "$name ($3): $(mib "$total") of 64 MiB, $verdict"
}
if grep -qx /docs/bench/ "$(git rev-parse --git-path info/exclude)" 2>/dev/null; then
  echo "the tree is lean (lean.sh on): run 'bash benchmarks/gpu/lean.sh off' before any commit"
fi
tree=$(tree_bytes "")
lean=$(tree_bytes docs/bench/)
echo "working tree: $(mib "$tree") MiB; lean (without docs/bench): $(mib "$lean") MiB"
check "lean call" "$lean" "$lean_call"
for call in "${!calls[@]}"; do check "call $((call + 1))" "$tree" "${calls[$call]}"; done
exit $over
