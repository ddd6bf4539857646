# `make test` and `make demo` each set up what they need in .venv first.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: test demo lint bench clean

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	# torch is pinned to the local CPU wheel (an unpinned torch pulls GBs of CUDA packages).
	$(PY) -m pip install -q --disable-pip-version-check torch==2.13.0
	# tgx was installed as "tgx" before it became tgx-trace: drop that record (and its script)
	$(PY) -m pip uninstall -q -y --disable-pip-version-check tgx 2>/dev/null || true
	# triton: the Triton kernel tests run its interpreter and compile to PTX without a GPU
	$(PY) -m pip install -q --disable-pip-version-check -e ".[torch,jax,numba,sql,fleet,test,triton]"
	touch $(STAMP)

test: $(STAMP)
	$(PY) -m pytest -n 2 tests tgx

demo: $(STAMP)
	$(PY) examples/demo.py

lint: $(STAMP)
	$(VENV)/bin/ruff check tgx tests bench examples

bench: $(STAMP)
	for f in bench/bench_*.py; do $(PY) $$f || exit 1; done

clean:
	rm -rf $(VENV) .pytest_cache
