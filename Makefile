# Everything runs from a project virtualenv that these targets create on first use.
PYTHON ?= $(shell for p in python3.13 python3.12 python3.11 python3.10 python3; do \
            command -v $$p >/dev/null 2>&1 && $$p -c 'import sys; sys.exit(sys.version_info < (3, 10))' 2>/dev/null && { echo $$p; break; }; done)
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: check test shapes kill-matrix matrix lint docs bench demo celery-suite clean

$(STAMP): pyproject.toml
	@test -n "$(PYTHON)" || { echo "make: Python 3.10 or newer is needed (set PYTHON=...)"; exit 1; }
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	touch $(STAMP)

## The edit loop (under two minutes): lint, type-check, and the unit and contract tests
## (fakeredis, and a real Redis for the contract rows; starts a throwaway one when none answers).
check: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy
	$(BIN)/python -m pytest tests/unit tests/contract -q $(PYTEST_ARGS)

## Unit and integration tests; starts a throwaway Redis when none answers.  The shapes
## matrix's fast rows run here; `make shapes` runs all of it.  The tests mostly wait on
## workers, so TEST_PROCESSES pytest processes share them out a file at a time, each on
## Redis databases and a RabbitMQ vhost of its own (tests/support/services.py);
## TEST_PROCESSES=0 runs them in this one process.
TEST_PROCESSES ?= 3
test: $(STAMP)
	$(BIN)/python -m pytest -m "not matrix" -n $(TEST_PROCESSES) --dist loadfile $(PYTEST_ARGS)

## The whole shapes matrix: every worker pool x both brokers x every settings source, each
## row a real publisher, worker and CLI (about 6 minutes).
shapes: $(STAMP)
	$(BIN)/python -m pytest tests/integration/test_shapes_matrix.py $(PYTEST_ARGS)

## The kill matrices: `priority-router migrate` on RabbitMQ SIGKILLed after each step, in
## both directions, then rerun, with every document counted once; and the caps and rates
## tests make test runs on Redis only, on RabbitMQ, and the gate's custody tests (a worker
## killed, the counter store emptied or paused at each step) on RabbitMQ (about 7 minutes).
kill-matrix: $(STAMP)
	$(BIN)/python -m pytest tests/integration/test_migrate_rabbitmq.py tests/integration/test_gate_workers.py \
	  tests/integration/test_gate_custody.py -m matrix $(PYTEST_ARGS)

## The Celery compatibility matrix (noxfile.py): the unit and contract tests and the
## integration tests marked compat, on the oldest supported Celery, kombu and redis-py, each
## Celery minor since and the newest (RabbitMQ too), each in its own virtualenv under .nox/;
## prints the results table at the end (about 22 minutes here beside other work).  NOX_ARGS="-s celery-5.6" runs
## one row; PYTEST_ARGS go to pytest.
matrix: $(STAMP)
	$(BIN)/nox $(NOX_ARGS) -- $(PYTEST_ARGS)

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy

## The documentation site (mkdocs with Material, mkdocs.yml) into site/; any warning (a broken
## link or anchor, a page missing from the nav, a bad API reference) fails it.
docs: $(STAMP)
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict

## Plain Celery vs the router on a noisy-neighbour workload; writes demo-results.png.
demo: $(STAMP)
	$(BIN)/priority-router demo $(DEMO_ARGS)

## Celery's own integration suite (canvas and tasks) against a real worker, without and then
## with the router, and the tests that pass only without it; about 20 minutes per run.
## SUITE="redis amqp" (amqp is skipped when no RabbitMQ answers).
SUITE ?= redis amqp
celery-suite: $(STAMP)
	@for broker in $(SUITE); do \
	  tests/celery_suite/run.sh $$broker --without-router || test $$? -eq 1 || exit 1; \
	  tests/celery_suite/run.sh $$broker || test $$? -eq 1 || exit 1; \
	  base=.celery-suite/results/$$broker-baseline.xml; routed=.celery-suite/results/$$broker-router.xml; \
	  if [ -f $$base ] && [ -f $$routed ]; then \
	    .celery-suite/venv/bin/python tests/celery_suite/compare.py $$base $$routed || exit 1; \
	  else echo "celery-suite: no $$broker results (broker not answering?)"; fi; \
	done

bench: $(STAMP)
	$(BIN)/python bench/store.py throughput
	$(BIN)/python bench/fairness.py

clean:
	rm -rf $(VENV) .nox .pytest_cache .mypy_cache .ruff_cache site
