# The two commands of the README: `make demo` and `make test`. Both set up .venv first.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed

.PHONY: install demo test clean

install: $(STAMP)

# torch first, pinned to the CPU wheel on disk: any looser spec pulls gigabytes of CUDA wheels.
$(STAMP): pyproject.toml Makefile
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	@$(PY) -c "import torch" 2>/dev/null || $(PY) -m pip install -q torch==2.13.0
	$(PY) -m pip install -q -e ".[test]"
	@touch $(STAMP)

demo: install
	$(VENV)/bin/softrl toy

test: install
	$(VENV)/bin/pytest -q

clean:
	rm -rf $(VENV) build src/*.egg-info
