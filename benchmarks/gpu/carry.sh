#!/usr/bin/env bash
# What each call of the plan (README.md, "The calls") sends, in MiB, against the device's 64: the working
# tree that travels (tracked files, and untracked ones git does not ignore) and the call's .whl folders.
# A call over the limit is refused before it starts, so check here, at no device time:
#   bash benchmarks/gpu/carry.sh      # exits 1 when a call is over
set -uo pipefail
cd "$(dirname "$0")/../.."
calls=("core base lance-1" "core base lance-2" "core base cache")
LIMIT=$((64 * 1024 * 1024))
mib() { awk -v b="$1" 'BEGIN {printf "%.1f", b / 1048576}'; }
git rev-parse --git-dir >/dev/null 2>&1 || { echo "carry: $PWD is not a git checkout: the tree that travels is unknown"; exit 1; }
# one du over the whole list (its total is the last line); -b counts a link as a link, as it travels, -l
# a hard-linked file each time; a file deleted but still tracked counts nothing
tree=$( (git ls-files -z --cached --others --exclude-standard; [ -d shared ] && find shared -type f -print0) |
  du -cbl --files0-from=- 2>/dev/null | tail -n 1 | cut -f1)
echo "working tree: $(mib "$tree") MiB"
over=0
for call in "${!calls[@]}"; do
  total=$tree verdict=ok
  for folder in ${calls[$call]}; do
    if [ ! -d ".whl/$folder" ]; then
      echo "call $((call + 1)): .whl/$folder is missing: bash benchmarks/gpu/wheels.sh"; verdict=INCOMPLETE over=1; continue
    fi
    total=$(( total + $(du -sbl ".whl/$folder" | cut -f1) ))
  done
  (( total > LIMIT )) && { verdict="OVER: carry less or shrink the tree"; over=1; }
  echo "call $((call + 1)) (${calls[$call]}): $(mib "$total") of 64 MiB, $verdict"
done
exit $over
