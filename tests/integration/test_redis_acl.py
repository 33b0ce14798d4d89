"""The router with a least-privilege Redis user: the ACL lines docs/deployment.md gives
for publishers, workers and the CLI, created as real ACL users on the test Redis, run each
role; a user refused one command is told so once, by name, with the rule that lifts it,
and the gate fails open instead of holding documents nothing will release."""

from __future__ import annotations

import json
import logging
import re
import shlex
import signal
import time
import traceback
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from urllib.parse import urlsplit

import pytest
import redis
from click.testing import CliRunner
from support.services import Worker, broker_db_url, counter_db_url, fast_redelivery, running_worker

from priority_router import PriorityRouter
from priority_router.ops.cli import main
from priority_router.router import engine_of
from workers.app import create_app

DOCS = Path(__file__).resolve().parents[2] / "docs" / "deployment.md"
TRACK = "tests.track_running"


def _documented_lines() -> dict[str, str]:
    """The ACL SETUSER lines of docs/deployment.md, by role (publisher, worker, cli)."""
    text = DOCS.read_text()
    block = text.split("<!-- acl-lines:", 1)[1].split("```text\n", 1)[1].split("```", 1)[0]
    lines = [line for line in block.splitlines() if line.startswith("ACL SETUSER")]
    return {line.split()[2].removeprefix("router-"): line for line in lines}


Users = Callable[..., str]


@pytest.fixture
def acl_users(redis_server_url: str, key_prefix: str) -> Iterator[Users]:
    """``make(role, without=())``: a real ACL user made from the documented line for
    ``role`` (the key pattern for this test's prefix, ``without`` those commands): its URL
    for the counter database."""
    admin = redis.Redis.from_url(counter_db_url(redis_server_url))
    made: list[str] = []

    def make(role: str, without: tuple[str, ...] = ()) -> str:
        words = shlex.split(_documented_lines()[role])
        user = f"pr-{role}-{uuid.uuid4().hex[:6]}"
        words[2] = user
        words = [w.replace("priority-router:", key_prefix) for w in words]
        words = [w.replace(">CHANGE-ME", ">pw-" + user) for w in words if w.lstrip("+") not in without]
        assert admin.execute_command(*words) in (b"OK", "OK", True)
        made.append(user)
        return counter_db_url(redis_server_url).replace("redis://", f"redis://{user}:pw-{user}@", 1)

    yield make
    for user in made:
        admin.acl_deluser(user)
    admin.close()


def _refused(redis_url: str, key_prefix: str, urls: list[str]) -> list[str]:
    """What the ACL log says the store refused the users of ``urls``: commands, and keys
    under the prefix (``status`` skips another router's keys, which the user may not read).
    The log is the server's: other tests running beside this one (a wrong password on
    purpose) write to it too."""
    users = {urlsplit(url).username for url in urls}
    client = redis.Redis.from_url(redis_url)
    try:
        entries = [e for e in client.acl_log() if e.get("username") in users]
    finally:
        client.close()
    mine = [e for e in entries if e.get("reason") != "key" or str(e.get("object")).startswith(key_prefix)]
    return [f"{e.get('username')}: {e.get('reason')} {e.get('object')}" for e in mine]


def _cli(url: str, key_prefix: str, *args: str) -> str:
    result = CliRunner().invoke(main, ["--redis-url", url, "--key-prefix", key_prefix, *args])
    if result.exit_code != 0 and result.exc_info is not None:
        print("".join(traceback.format_exception(*result.exc_info)))
    assert result.exit_code == 0, result.output
    return result.output


@pytest.mark.parametrize("mode", ["seed", "inflight"])
def test_the_documented_acl_lines_run_a_publisher_a_capped_worker_and_the_cli(
    mode: str,
    acl_users: Users,
    worker_env: dict[str, str],
    redis_server_url: str,
    key_prefix: str,
) -> None:
    admin_url = counter_db_url(redis_server_url)
    redis.Redis.from_url(admin_url).acl_log_reset()
    cli_url, publisher_url, worker_url = (acl_users(role) for role in ("cli", "publisher", "worker"))
    runs = f"runs-{uuid.uuid4().hex[:8]}"
    env = {**worker_env, "PRIORITY_ROUTER_MODE": mode, "PRIORITY_ROUTER_LEASE": "3"}
    env.update(RUNS_REDIS_URL=admin_url, RUNS_KEY=runs)
    # Nothing tracked yet, and another router's prefix in the store: status looks for it,
    # and skips the keys the user may not read.
    other = f"other-{uuid.uuid4().hex[:6]}:schema"
    redis.Redis.from_url(admin_url).set(other, "3", ex=60)
    assert "0 client(s) tracked" in _cli(cli_url, key_prefix, "--mode", mode, "status")
    _cli(cli_url, key_prefix, "--mode", mode, "tier", "set", "bulk", "--max-in-flight", "1")

    app = create_app({**env, "PRIORITY_ROUTER_REDIS_URL": publisher_url})
    sent = [app.send_task(TRACK, kwargs={"seconds": 0.3, "client_id": "bulk"}) for _ in range(4)]
    sent += [app.send_task("tests.record_request", kwargs={"client_id": "light"})]
    with running_worker(
        {**env, "PRIORITY_ROUTER_REDIS_URL": worker_url}, "--pool", "threads", "-c", "3"
    ) as w:
        done = [r.get(timeout=60) for r in sent]
        log = w.output()
    seen = redis.Redis.from_url(admin_url)
    assert int(seen.hget(runs, "max:bulk") or 0) == 1, log  # the cap held, with the worker's user
    seen.delete(runs)
    assert done[-1]["reason"] == "counted", done[-1]  # the publisher's user counted it
    assert "refuses" not in log and "not answering" not in log and "failed" not in log, log

    _cli(cli_url, key_prefix, "--mode", mode, "status")
    _cli(cli_url, key_prefix, "--mode", mode, "inspect", "light")
    _cli(cli_url, key_prefix, "--mode", mode, "tier", "unset", "bulk")
    _cli(cli_url, key_prefix, "--mode", mode, "reset", "light", "--yes")
    # Nothing any role did was refused: the lines hold every command the router sent.
    assert _refused(admin_url, key_prefix, [cli_url, publisher_url, worker_url]) == []


def test_a_publisher_refused_a_command_says_so_once_and_keeps_counting(
    acl_users: Users, key_prefix: str, caplog: pytest.LogCaptureFixture
) -> None:
    # The seed mode, where only the reads of the tier and cost markers use EXISTS (the
    # inflight mode's publish script asks it at every publish).
    url = acl_users("publisher", without=("exists",))
    router = PriorityRouter(redis_url=url, key_prefix=key_prefix, cooldown=0.2)
    with caplog.at_level(logging.INFO, logger="priority_router"):
        decisions = [router.decide("acme", task_id=f"t{n}") for n in range(20)]
        time.sleep(0.5)  # a breaker would have probed the store and said it answers again
        decisions += [router.decide("acme", task_id=f"u{n}") for n in range(20)]
    user = url.split("//", 1)[1].split(":", 1)[0]
    # This router's records: an engine an earlier test left (its user since deleted) may
    # still retry its confirms in a thread of this process and say so meanwhile.
    said = [r for r in caplog.records if r.name == "priority_router" and user in r.getMessage()]
    errors = [r.getMessage() for r in said if r.levelno == logging.ERROR]
    assert len(errors) == 1, [r.getMessage() for r in said]
    assert "refuses the EXISTS command" in errors[0] and f"ACL SETUSER {user} +exists" in errors[0]
    # No outage: no WARNING that the store is down, no INFO that it answers again.
    assert [r.getMessage() for r in said if r.levelno in (logging.WARNING, logging.INFO)] == []
    assert sum(d.reason.value == "counted" for d in decisions) >= 30


@pytest.mark.parametrize("pool", ["threads", "prefork"])
def test_a_worker_refused_a_command_of_the_gate_fails_the_gate_open(
    pool: str, acl_users: Users, worker_env: dict[str, str], redis_server_url: str, key_prefix: str
) -> None:
    admin_url = counter_db_url(redis_server_url)
    cli_url = acl_users("cli")
    worker_url = acl_users("worker", without=("zrem",))
    runs = f"runs-{uuid.uuid4().hex[:8]}"
    env = {**worker_env, "PRIORITY_ROUTER_LEASE": "3", "RUNS_REDIS_URL": admin_url, "RUNS_KEY": runs}
    _cli(cli_url, key_prefix, "tier", "set", "bulk", "--max-in-flight", "1")
    app = create_app(env)
    sent = [app.send_task(TRACK, kwargs={"seconds": 0.2, "client_id": "bulk"}) for _ in range(6)]
    worker = {**env, "PRIORITY_ROUTER_REDIS_URL": worker_url}
    with running_worker(worker, "--pool", pool, "-c", "3") as w:
        # Nothing is held for good: every document runs, as no end could release it.
        done = [r.get(timeout=30) for r in sent]
        log = w.output()
    redis.Redis.from_url(admin_url).delete(runs)
    assert len(done) == 6
    user = worker_url.split("//", 1)[1].split(":", 1)[0]
    refusals = re.findall(r"refuses the (\w+) command", log)
    assert refusals == ["ZREM"], log  # one ERROR, naming the command
    assert f"ACL SETUSER {user} +zrem" in log, log
    assert "not answering" not in log and "answering again" not in log and "sweep failed" not in log, log


def doctor_on_store(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, redis_url: str, broker: str, key_prefix: str = "pr:"
) -> dict[str, str]:
    """``priority-router doctor -A app --json``'s counter-store finding for an app whose
    router uses ``redis_url``."""
    name = f"acl_app_{uuid.uuid4().hex[:8]}"
    (tmp_path / f"{name}.py").write_text(
        "from celery import Celery\nfrom priority_router import PriorityRouter\n"
        f"app = Celery({name!r}, broker={broker!r})\n"
        f"PriorityRouter(redis_url={redis_url!r}, key_prefix={key_prefix!r}, connect_timeout=2, "
        "socket_timeout=2).install(app)\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    doctor = CliRunner().invoke(main, ["doctor", "-A", name, "--json"])
    findings = json.loads(doctor.output)
    finding: dict[str, str] = next(f for f in findings if f["check"] == "counter store")
    return finding


def test_doctor_tells_a_refused_command_a_wrong_password_and_a_store_that_does_not_answer_apart(
    acl_users: Users, redis_server_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, key_prefix: str
) -> None:
    broker = broker_db_url(redis_server_url)

    def doctor(url: str) -> dict[str, str]:
        return doctor_on_store(tmp_path, monkeypatch, url, broker, key_prefix)

    url = acl_users("cli", without=("ping",))
    user = url.split("//", 1)[1].split(":", 1)[0]
    refused = doctor(url)
    assert "answers, but refuses this Redis user the PING command" in refused["detail"], refused
    assert refused["fix"].startswith(f"ACL SETUSER {user} +ping"), refused
    # INFO, which only doctor asks (for the version), is no failure: the router counts.
    without_info = doctor(acl_users("cli", without=("info",)))
    assert without_info["ok"] and "may not run INFO" in without_info["detail"], without_info

    wrong = doctor(url.replace(f":pw-{user}@", ":wrong@"))
    assert "refuses the URL's user or password" in wrong["detail"], wrong
    assert "password" in wrong["fix"] and "start Redis" not in wrong["fix"], wrong

    down = doctor("redis://127.0.0.1:1/0")
    assert "does not answer" in down["detail"] and "start Redis there" in down["fix"], down


def test_the_cli_names_a_refused_command_and_the_rule_that_lifts_it(
    acl_users: Users, key_prefix: str
) -> None:
    url = acl_users("cli", without=("scan",))
    user = url.split("//", 1)[1].split(":", 1)[0]
    result = CliRunner().invoke(main, ["--redis-url", url, "--key-prefix", key_prefix, "status"])
    assert result.exit_code == 1, result.output
    assert "'scan'" in result.output and f"Fix: ACL SETUSER {user} +scan" in result.output, result.output


@pytest.mark.parametrize("broker_url", ["redis"], indirect=True)
def test_documents_held_before_a_worker_is_killed_run_under_a_worker_whose_user_is_refused_the_gate(
    acl_users: Users, worker_env: dict[str, str], redis_server_url: str, key_prefix: str
) -> None:
    """A worker holds a capped client's documents and is SIGKILLed; the next one's user lacks
    LREM: its gate opens as it starts and releases what the holding queue holds."""
    admin_url = counter_db_url(redis_server_url)
    runs = f"runs-{uuid.uuid4().hex[:8]}"
    env = {**worker_env, "PRIORITY_ROUTER_LEASE": "3", "RUNS_REDIS_URL": admin_url, "RUNS_KEY": runs}
    env["BROKER_TRANSPORT_OPTIONS"] = fast_redelivery(env)
    router = PriorityRouter.from_env({**env, "PRIORITY_ROUTER_REDIS_URL": acl_users("cli")})
    router.set_tier("bulk", max_in_flight=1)
    app = create_app(env)
    sent = [app.send_task(TRACK, kwargs={"seconds": 1.0, "client_id": "bulk"}) for _ in range(5)]
    first = Worker({**env, "PRIORITY_ROUTER_REDIS_URL": acl_users("worker")}, "--pool", "threads", "-c", "3")
    try:
        first.wait_ready()
        deadline = time.monotonic() + 30
        while router.gate_state("bulk").held < 4:
            assert time.monotonic() < deadline, first.output()
            time.sleep(0.05)
        first.process.send_signal(signal.SIGKILL)
        first.process.wait()
    finally:
        first.stop()
    refused = {**env, "PRIORITY_ROUTER_REDIS_URL": acl_users("worker", without=("lrem",))}
    with running_worker(refused, "--pool", "threads", "-c", "3") as second:
        done = [r.get(timeout=60) for r in sent]
        log = second.output()
    seen = redis.Redis.from_url(admin_url)
    ran = [int(seen.hget(runs, f"run:{r.id}") or 0) for r in sent]
    seen.delete(runs)
    assert len(done) == 5 and all(n >= 1 for n in ran), (ran, log)
    assert ran.count(1) >= 4, ran  # only the one running at the kill may run twice
    assert re.findall(r"refuses the (\w+) command", log) == ["LREM"], log


def test_a_worker_refused_the_read_of_the_limits_says_so(
    acl_users: Users, key_prefix: str, caplog: pytest.LogCaptureFixture
) -> None:
    PriorityRouter(redis_url=acl_users("cli"), key_prefix=key_prefix).set_tier("bulk", max_in_flight=1)
    router = PriorityRouter(redis_url=acl_users("worker", without=("hgetall",)), key_prefix=key_prefix)
    with caplog.at_level(logging.ERROR, logger="priority_router"):
        # What a worker's gate reads: unread, so none is enforced.
        assert engine_of(router).limit_store.snapshot().of("bulk").max_in_flight is None
    errors = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
    assert len(errors) == 1 and "refuses the HGETALL command" in errors[0], errors
    assert "enforces none" in errors[0] and "+hgetall" in errors[0], errors


@pytest.mark.parametrize("broker_url", ["redis"], indirect=True)
def test_a_worker_refused_a_command_of_the_gate_with_no_client_limited_says_what_it_means(
    acl_users: Users, worker_env: dict[str, str]
) -> None:
    """No 'the gate's sweep failed' WARNING: one ERROR, naming the command, that nothing is
    held now, and what a limit would meet."""
    app = create_app(worker_env)
    sent = app.send_task("tests.record_request", kwargs={"client_id": "acme"})
    worker = {**worker_env, "PRIORITY_ROUTER_REDIS_URL": acl_users("worker", without=("zrangebyscore",))}
    with running_worker(worker, "--pool", "threads", "-c", "2") as w:
        assert sent.get(timeout=30)["client_id"] == "acme"
        time.sleep(2.5)  # the gate's thread sweeps every 2 s without limits
        log = w.output()
    assert re.findall(r"refuses the (\w+) command", log) == ["ZRANGEBYSCORE"], log
    assert "no client has limits now" in log and "+zrangebyscore" in log, log
    assert "sweep failed" not in log, log


def test_a_worker_refused_the_look_for_an_older_releases_held_documents_says_so_and_keeps_the_cap(
    acl_users: Users, worker_env: dict[str, str], redis_server_url: str, key_prefix: str
) -> None:
    """A worker user made from the line of a release before adoption (no SCAN): the gate
    does not open for it; one ERROR names SCAN and the rule, and the cap holds."""
    admin_url = counter_db_url(redis_server_url)
    cli_url = acl_users("cli")
    worker_url = acl_users("worker", without=("scan",))
    runs = f"runs-{uuid.uuid4().hex[:8]}"
    env = {**worker_env, "PRIORITY_ROUTER_LEASE": "3", "RUNS_REDIS_URL": admin_url, "RUNS_KEY": runs}
    _cli(cli_url, key_prefix, "tier", "set", "bulk", "--max-in-flight", "1")
    app = create_app(env)
    sent = [app.send_task(TRACK, kwargs={"seconds": 0.2, "client_id": "bulk"}) for _ in range(6)]
    with running_worker(
        {**env, "PRIORITY_ROUTER_REDIS_URL": worker_url}, "--pool", "threads", "-c", "3"
    ) as w:
        done = [r.get(timeout=30) for r in sent]
        log = w.output()
    seen = redis.Redis.from_url(admin_url)
    assert int(seen.hget(runs, "max:bulk") or 0) == 1, log
    seen.delete(runs)
    assert len(done) == 6
    user = worker_url.split("//", 1)[1].split(":", 1)[0]
    assert re.findall(r"refuses the (\w+) command", log) == ["SCAN"], log
    assert f"ACL SETUSER {user} +scan" in log and "older release" in log, log
    assert "gate is open" not in log and "sweep failed" not in log, log
