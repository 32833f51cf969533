# The two commands the README promises: `make demo` and `make test`.
PYTHON ?= python3
PIP_INSTALL = $(PYTHON) -m pip install --quiet --disable-pip-version-check -c constraints.txt

.PHONY: install install-dev demo test lint bench

install:
	$(PIP_INSTALL) -e .

install-dev:
	$(PIP_INSTALL) -e ".[dev]"
	bash scripts/install_chromium.sh

demo: install
	$(PYTHON) -m dataguard run pipelines/sft.yaml

test: install-dev
	$(PYTHON) -m ruff check dataguard tests benchmarks
	$(PYTHON) -m pytest -q -p no:cacheprovider

bench: install
	$(PYTHON) benchmarks/bench_io.py
