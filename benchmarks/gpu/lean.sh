#!/usr/bin/env bash
# For the length of a lease, keep docs/bench (27 of the tree's 29 MiB: outcomes, figures, kept reference
# weights; no GPU step reads it) from travelling, so that one call carries all the wheels at once (both
# halves of pylance and the demo's cache with core and base: 60 MiB with the 2 MiB left of the tree):
#   bash benchmarks/gpu/lean.sh on     # docs/bench leaves git's index and is excluded; its files stay
#   bash benchmarks/gpu/lean.sh off    # back in the index, as it was
# The device sends tracked files and untracked ones git does not ignore, so an untracked, excluded folder
# stays behind. Between on and off a commit would delete docs/bench: `off` first (`on` refuses to start
# over staged changes, and carry.sh says when the tree is lean).
set -euo pipefail
cd "$(dirname "$0")/../.."
exclude=$(git rev-parse --git-path info/exclude)
line=/docs/bench/
case ${1:-} in
  on)
    if grep -qx "$line" "$exclude" 2>/dev/null; then echo "lean: already on"; exit 0; fi
    if ! git diff --cached --quiet; then echo "lean: the index has staged changes: commit or unstage them first"; exit 1; fi
    git rm -r --cached -q docs/bench
    echo "$line" >> "$exclude"
    echo "lean: on (docs/bench stays here, untracked; run 'bash benchmarks/gpu/lean.sh off' before any commit)" ;;
  off)
    if ! grep -qx "$line" "$exclude" 2>/dev/null; then echo "lean: already off"; exit 0; fi
    grep -vx "$line" "$exclude" > "$exclude.new" || true
    mv "$exclude.new" "$exclude"
    git reset -q -- docs/bench
    echo "lean: off" ;;
  *) echo "usage: bash benchmarks/gpu/lean.sh on|off"; exit 2 ;;
esac
