"""pytest plugin: install a PriorityRouter on the apps of Celery's own integration suite.

Loaded by ``run.sh`` with ``-p plugin`` (``PYTHONPATH`` = this folder); never loaded by
the project's own tests.

Which fixtures, and why
-----------------------
Celery's ``t/integration/conftest.py`` imports ``celery_app``, ``celery_session_app``
and ``celery_session_worker`` from ``celery.contrib.pytest``. A conftest fixture wins
over a plugin fixture of the same name, so this plugin cannot replace them; it wraps
their *setup* instead (``pytest_fixture_setup`` hook wrapper) and installs the router
on the app each one returns:

* ``celery_session_app`` (session scope): the app of the embedded worker. Its setup
  finishes before ``celery_session_worker`` builds the worker (the worker fixture takes
  the app as an argument), so the router is installed before the worker starts, as a
  user installs it "after configuring the app" and before ``worker_main``. Publishes
  made *inside* tasks (chains, chords, retries, replace) go through this app.
* ``celery_app`` (function scope): a new ``TestApp`` with the same ``celery_config``
  for every test. The suite's ``app``/``manager`` fixtures use it, and the autouse
  ``ZZZZ_set_app_current`` makes it current, so every ``task.delay()`` of a test body
  publishes through it, not through the worker's app. It gets its own install, and an
  ``uninstall`` at its teardown (before ``app.close()``; finalizers run last-in,
  first-out), so receivers do not pile up on the process-wide ``before_task_publish``.

Every publish gets the client id ``suite-client`` from ``client_id_getter``. The
counter lives in a Redis db the suite does not use (``CELERY_SUITE_ROUTER_REDIS_URL``,
set by run.sh) under the ``celery-suite:`` prefix.
"""

from __future__ import annotations

import os
from typing import Any

import pytest

# Imported now, so the installed Celery is the one in sys.modules before pytest puts
# the sdist's root on sys.path (run.sh also moves the sdist's own celery/ aside).
from priority_router import PriorityRouter

ROUTER_REDIS_URL = os.environ.get("CELERY_SUITE_ROUTER_REDIS_URL", "redis://127.0.0.1:6379/5")
KEY_PREFIX = "celery-suite:"
APP_FIXTURES = ("celery_session_app", "celery_app")

_router: PriorityRouter | None = None


def suite_client(name: str, args: Any, kwargs: Any, headers: Any) -> str:
    return "suite-client"


def router() -> PriorityRouter:
    global _router
    if _router is None:
        _router = PriorityRouter(
            redis_url=ROUTER_REDIS_URL,
            key_prefix=KEY_PREFIX,
            client_id_getter=suite_client,
        )
    return _router


@pytest.hookimpl(wrapper=True)
def pytest_fixture_setup(fixturedef: pytest.FixtureDef[Any], request: pytest.FixtureRequest) -> Any:
    app = yield
    if fixturedef.argname in APP_FIXTURES:
        r = router()
        r.install(app)
        fixturedef.addfinalizer(lambda: r.uninstall(app))
    return app


def pytest_report_header(config: pytest.Config) -> str:
    return (
        f"celery-suite: PriorityRouter(redis_url={ROUTER_REDIS_URL!r}, key_prefix={KEY_PREFIX!r}) "
        f"installed on {', '.join(APP_FIXTURES)}"
    )
