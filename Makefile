# The two commands the README promises: `make demo` and `make test`.
#
# Both install from requirements/dev.lock, the complete lock (every transitive package pinned)
# that the tests last ran green with. Library users keep the ranges in pyproject.toml.
#   make lock         refresh the lock after changing pyproject.toml or constraints.txt
#   make test-latest  the tests against the newest releases the ranges allow (no lock): run it
#                     by hand or on a schedule to learn when a new release breaks the ranges
PYTHON ?= python3
LOCK = requirements/dev.lock
PIP = $(PYTHON) -m pip install --quiet --disable-pip-version-check
PIP_INSTALL = $(PIP) -c constraints.txt -c $(LOCK)

.PHONY: install install-dev install-latest demo test test-latest lint bench lock

install:
	$(PIP_INSTALL) -e .

install-dev:
	$(PIP_INSTALL) -e ".[dev]"
	$(PIP) --no-deps -r requirements/no-deps.txt
	bash scripts/install_chromium.sh

# No lock: only constraints.txt (the CPU torch that lies on disk) and pyproject.toml's ranges.
install-latest:
	$(PIP) --upgrade --upgrade-strategy eager -c constraints.txt -e ".[dev]"
	$(PIP) --no-deps -r requirements/no-deps.txt
	bash scripts/install_chromium.sh

demo: install
	$(PYTHON) -m dataguard run pipelines/sft.yaml

lint:
	$(PYTHON) -m ruff check dataguard tests benchmarks

test: install-dev lint
	DATAGUARD_NO_SKIPS=1 $(PYTHON) -m pytest -q -p no:cacheprovider

test-latest: install-latest lint
	$(PYTHON) -m pytest -q -p no:cacheprovider

# pip-tools resolves pyproject.toml's [dev] extra under constraints.txt into the full lock.
lock:
	$(PIP) pip-tools==7.6.2
	$(PYTHON) -m piptools compile --quiet --extra dev --constraint constraints.txt --strip-extras \
	    --no-emit-index-url --no-emit-find-links --output-file $(LOCK) pyproject.toml

bench: install
	$(PYTHON) benchmarks/bench_io.py
