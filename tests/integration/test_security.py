"""The example workers accept JSON only: a pickled message is refused, never run; Celery's
own commands never print the counter store's password."""

from __future__ import annotations

import importlib
import os
import subprocess
import sys
import textwrap
import time
import uuid
from collections.abc import Callable
from pathlib import Path

import redis
from celery import Celery
from support.services import close_app, counter_db_url, running_worker, worker_environment

from priority_router import PriorityRouter


def test_worker_refuses_pickle(producer: Callable[[], Celery], worker_env: dict[str, str]) -> None:
    app = producer()
    attacker = Celery("attacker", broker=worker_env["BROKER_URL"], backend=worker_env["RESULT_BACKEND"])
    attacker.conf.update(
        task_default_queue=worker_env["DOCUMENT_QUEUE"],
        task_serializer="pickle",
        accept_content=["pickle", "json"],
        task_queue_max_priority=10,  # declare the queue as the workers expect it
    )
    pickled = attacker.send_task("tests.record_request", kwargs={"client_id": "mallory"})
    with running_worker(worker_env, "--pool", "solo") as worker:
        honest = app.send_task("tests.record_request", kwargs={"client_id": "acme"})
        assert honest.get(timeout=60)["client_id"] == "acme"
        log = worker.output()
    assert "ContentDisallowed" in log or "disallowed" in log.lower(), log
    assert app.AsyncResult(pickled.id).state == "PENDING"
    close_app(attacker)


SECRET = "Sup3r-s3cret-pw"


def test_celery_prints_the_store_setting_without_its_password(
    worker_env: dict[str, str], redis_server_url: str, key_prefix: str, tmp_path: Path
) -> None:
    """Celery masks only settings named like secrets and its own broker and backend URLs:
    with the documented ``priority_router_redis_url``, ``celery inspect conf`` (a running
    worker's answer) and ``celery report`` printed the store's password. Both show it masked
    now, while the publisher and the worker still count with it (an ACL user's password)."""
    admin = redis.Redis.from_url(counter_db_url(redis_server_url))
    user = f"secret-{os.getpid()}"
    admin.acl_setuser(
        user, enabled=True, passwords=[f"+{SECRET}"], keys=["*"], channels=["*"], commands=["+@all"]
    )
    store = counter_db_url(redis_server_url).replace("redis://", f"redis://{user}:{SECRET}@", 1)
    module = f"secret_app_{uuid.uuid4().hex[:8]}"
    (tmp_path / f"{module}.py").write_text(
        textwrap.dedent(
            f"""
            from celery import Celery
            from priority_router import PriorityRouter

            app = Celery({module!r}, include=["worker_tasks"])
            app.conf.update(
                broker_url={worker_env["BROKER_URL"]!r},
                result_backend={worker_env["RESULT_BACKEND"]!r},
                task_default_queue={worker_env["DOCUMENT_QUEUE"]!r},
                priority_router_redis_url={store!r},
                priority_router_key_prefix={key_prefix!r},
                priority_router_mode="inflight",
            )
            PriorityRouter().install(app)
            """
        )
    )
    env = {
        "PYTHONPATH": str(tmp_path),
        **{k: v for k, v in worker_env.items() if not k.startswith("PRIORITY_ROUTER_")},
    }
    sys.path.insert(0, str(tmp_path))
    try:
        app = importlib.import_module(module).app
        results = [app.send_task("tests.record_request", kwargs={"client_id": "acme"}) for _ in range(3)]
        publisher = PriorityRouter(store, key_prefix=key_prefix, mode="inflight")
        assert publisher.state("acme").counted == 3  # counted by the app's router, with the password
        assert SECRET not in str(app.conf.priority_router_redis_url)
        with running_worker(env, "--pool", "threads", "-c", "2", app=module):
            assert [r.get(timeout=60)["client_id"] for r in results] == ["acme"] * 3
            shown = _celery(env, module, "inspect", "conf", "--timeout", "10")
            assert f"{user}:***@" in shown, shown
            assert SECRET not in shown
        report = _celery(env, module, "report")
        assert "priority_router_redis_url" in report and f"{user}:***@" in report, report
        assert SECRET not in report
        deadline = time.monotonic() + 30
        while publisher.state("acme").counted and time.monotonic() < deadline:
            time.sleep(0.2)
        assert publisher.state("acme").counted == 0  # ended by the worker's router
        close_app(app)
    finally:
        sys.path.remove(str(tmp_path))
        sys.modules.pop(module, None)
        admin.acl_deluser(user)


def _celery(env: dict[str, str], module: str, *args: str) -> str:
    done = subprocess.run(
        [sys.executable, "-m", "celery", "-A", module, *args],
        env=worker_environment(env),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout + done.stderr
