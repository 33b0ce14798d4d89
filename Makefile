# Everything runs from a project virtualenv that these targets create on first use.
PYTHON ?= $(shell for p in python3.13 python3.12 python3.11 python3.10 python3; do \
            command -v $$p >/dev/null 2>&1 && $$p -c 'import sys; sys.exit(sys.version_info < (3, 10))' 2>/dev/null && { echo $$p; break; }; done)
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: test lint bench demo celery-suite clean

$(STAMP): pyproject.toml
	@test -n "$(PYTHON)" || { echo "make: Python 3.10 or newer is needed (set PYTHON=...)"; exit 1; }
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	touch $(STAMP)

## Unit and integration tests; starts a throwaway Redis when none answers.
test: $(STAMP)
	$(BIN)/python -m pytest $(PYTEST_ARGS)

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy

## Plain Celery vs the router on a noisy-neighbour workload; writes demo-results.png.
demo: $(STAMP)
	$(BIN)/priority-router demo $(DEMO_ARGS)

## Celery's own integration suite (canvas and tasks) with the router installed, against a
## real worker on Redis and RabbitMQ; about 20 minutes per broker. SUITE=redis|amqp|both.
SUITE ?= both
celery-suite: $(STAMP)
	bash tests/celery_suite/run.sh $(SUITE) $(SUITE_ARGS)

bench: $(STAMP)
	$(BIN)/python bench/counter_throughput.py
	$(BIN)/python bench/fairness.py

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache
