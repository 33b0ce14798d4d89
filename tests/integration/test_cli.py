"""The operator CLI against a real Redis, in-process (CliRunner) and as a real program."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from click.testing import CliRunner, Result
from support.services import start_embedded_redis

from priority_router import PriorityRouter
from priority_router.ops.cli import main

pytestmark = pytest.mark.compat


@pytest.fixture
def router(counter_url: str, key_prefix: str) -> PriorityRouter:
    router = PriorityRouter(redis_url=counter_url, key_prefix=key_prefix)
    for _ in range(22):
        router.record("bulk")
    for _ in range(5):
        router.record("medium")
    router.record("light")
    return router


def test_status_lists_every_client_sorted_by_priority(
    cli: Callable[..., Result], router: PriorityRouter
) -> None:
    result = cli("status", "--json")
    assert result.exit_code == 0, result.output
    rows = json.loads(result.output)
    assert [(r["client_id"], r["pending"], r["priority"]) for r in rows] == [
        ("light", 0, 1),
        ("medium", -4, 2),
        ("bulk", -21, 9),
    ]
    for r in rows:
        assert 0 <= r["seconds_since_update"] < 60
        assert 1440 < r["seconds_until_reset"] <= 1500

    table = cli("status")
    assert table.exit_code == 0
    assert table.output.index("light") < table.output.index("medium") < table.output.index("bulk")
    assert "3 client(s) tracked" in table.output
    # Apps that share a store under different prefixes: the title says whose clients these are.
    assert f"key prefix {router.config.key_prefix!r}" in " ".join(table.output.split())


def test_inspect_reads_without_counting(cli: Callable[..., Result], router: PriorityRouter) -> None:
    row = json.loads(cli("inspect", "medium", "--json").output)
    assert (row["pending"], row["priority"], row["tracked"]) == (-4, 2, True)
    assert router.peek("medium").pending == -4
    unknown = json.loads(cli("inspect", "nobody", "--json").output)
    assert (unknown["pending"], unknown["priority"], unknown["tracked"]) == (0, 1, False)


def test_reset_one_client_asks_first(cli: Callable[..., Result], router: PriorityRouter) -> None:
    declined = cli("reset", "bulk", input="n\n")
    assert declined.exit_code == 1
    assert router.peek("bulk").pending == -21

    done = cli("reset", "bulk", "--yes")
    assert done.exit_code == 0, done.output
    assert router.peek("bulk").pending == 0
    assert router.peek("medium").pending == -4


def test_reset_all_needs_yes(cli: Callable[..., Result], router: PriorityRouter) -> None:
    refused = cli("reset", "--all")
    assert refused.exit_code == 2
    assert "--yes" in refused.output
    assert router.peek("bulk").pending == -21

    done = cli("reset", "--all", "--yes")
    assert done.exit_code == 0
    assert "reset every client's count: 3 key(s) of the seed mode, 0 of the inflight mode" in done.output
    assert json.loads(cli("status", "--json").output) == []


def test_reset_needs_exactly_one_target(cli: Callable[..., Result]) -> None:
    assert cli("reset").exit_code == 2
    assert cli("reset", "x", "--all", "--yes").exit_code == 2


def test_passwords_never_reach_the_output() -> None:
    result = CliRunner().invoke(main, ["--redis-url", "redis://:hunter2@127.0.0.1:1/0", "status"])
    assert result.exit_code == 1
    assert "hunter2" not in result.output
    assert "***" in result.output


def test_a_failing_command_given_json_prints_a_json_error() -> None:
    """A script reading --json got an empty stdout on a failure (found with migrate)."""
    result = CliRunner().invoke(main, ["--redis-url", "redis://:hunter2@127.0.0.1:1/0", "status", "--json"])
    assert result.exit_code == 1
    error = json.loads(result.stdout)
    assert error["exit_code"] == 1 and "127.0.0.1:1" in error["error"] and "hunter2" not in result.stdout
    assert error["error"] in result.stderr


def test_bad_url_names_the_setting() -> None:
    result = CliRunner().invoke(main, ["--redis-url", "http://example", "status"])
    assert result.exit_code == 2
    assert "redis_url" in result.output and "Fix:" in result.output


def test_installed_program_reads_the_environment(
    router: PriorityRouter, counter_url: str, key_prefix: str
) -> None:
    program = Path(sys.executable).parent / "priority-router"
    assert program.exists(), "the console script is not installed: pip install -e ."
    env = {**os.environ, "PRIORITY_ROUTER_REDIS_URL": counter_url, "PRIORITY_ROUTER_KEY_PREFIX": key_prefix}
    done = subprocess.run(
        [str(program), "status", "--json"], env=env, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    assert [r["client_id"] for r in json.loads(done.stdout)] == ["light", "medium", "bulk"]

    module = subprocess.run(
        [sys.executable, "-m", "priority_router", "inspect", "bulk", "--json"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert json.loads(module.stdout)["priority"] == 9


def test_status_uses_the_router_installed_on_an_app(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, counter_url: str, key_prefix: str
) -> None:
    # A custom table: 5 documents are already priority 9 under it (1 under the seed table).
    (tmp_path / "custom_app.py").write_text(
        "from celery import Celery\n"
        "from priority_router import Policy, PriorityRouter\n"
        "app = Celery('custom', broker='memory://')\n"
        f"router = PriorityRouter(redis_url={counter_url!r}, key_prefix={key_prefix!r},\n"
        "                        thresholds=Policy.from_rows([(-3, 9)]))\n"
        "router.install(app)\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    router = PriorityRouter(redis_url=counter_url, key_prefix=key_prefix)
    for _ in range(5):
        router.record("busy")
    result = CliRunner().invoke(main, ["status", "-A", "custom_app", "--json"])
    assert result.exit_code == 0, result.output
    assert [(r["client_id"], r["priority"]) for r in json.loads(result.output)] == [("busy", 9)]

    plain = tmp_path / "plain_app.py"
    plain.write_text("from celery import Celery\napp = Celery('plain', broker='memory://')\n")
    refused = CliRunner().invoke(main, ["status", "-A", "plain_app"])
    assert refused.exit_code == 2
    assert "no PriorityRouter is installed" in refused.output


def test_store_options_after_the_subcommand_win(
    counter_url: str, key_prefix: str, router: PriorityRouter, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PRIORITY_ROUTER_REDIS_URL", "redis://127.0.0.1:1/0")
    runner = CliRunner()
    after = runner.invoke(main, ["status", "--json", "--redis-url", counter_url, "--key-prefix", key_prefix])
    assert after.exit_code == 0, after.output
    assert [r["client_id"] for r in json.loads(after.output)] == ["light", "medium", "bulk"]
    both = runner.invoke(
        main,
        [
            *("--redis-url", "redis://127.0.0.1:1/0", "inspect", "medium", "--json"),
            *("--redis-url", counter_url, "--key-prefix", key_prefix),
        ],
    )
    assert json.loads(both.output)["pending"] == -4


def test_the_inflight_mode_reads_and_resets_the_in_flight_sets(
    cli: Callable[..., Result], counter_url: str, key_prefix: str
) -> None:
    router = PriorityRouter(redis_url=counter_url, key_prefix=key_prefix, mode="inflight")
    for n in range(6):
        router.record("busy", f"task-{n}")
    router.record("idle", "task-x")
    router.end("idle", "task-x")
    router.end("busy", "task-0")
    PriorityRouter(redis_url=counter_url, key_prefix=key_prefix).record("seed-only")

    rows = json.loads(cli("--mode", "inflight", "status", "--json").output)
    assert [(r["client_id"], r["pending"], r["in_flight"]) for r in rows] == [("busy", -4, 5)]
    seed_rows = json.loads(cli("status", "--json").output)
    assert [r["client_id"] for r in seed_rows] == ["seed-only"], "each mode lists only its own keys"

    row = json.loads(cli("--mode", "inflight", "inspect", "busy", "--json").output)
    assert (row["pending"], row["priority"], row["tracked"]) == (-4, 2, True)
    table = cli("--mode", "inflight", "status").output
    assert "in flight" in table

    done = cli("--mode", "inflight", "reset", "--all", "--yes")
    assert done.exit_code == 0, done.output
    # busy's list and its order key; idle's emptied list is gone.
    assert "1 key(s) of the seed mode, 2 of the inflight mode" in done.output, "both modes' keys"
    assert router.peek("busy").pending == 0
    assert json.loads(cli("status", "--json").output) == []


def test_reset_clears_one_client_in_both_modes(
    cli: Callable[..., Result], counter_url: str, key_prefix: str
) -> None:
    inflight = PriorityRouter(redis_url=counter_url, key_prefix=key_prefix, mode="inflight")
    seed = PriorityRouter(redis_url=counter_url, key_prefix=key_prefix)
    inflight.record("acme", "t1")
    seed.record("acme")
    seed.record("acme")
    done = cli("--mode", "inflight", "reset", "acme", "--yes")
    assert done.exit_code == 0, done.output
    assert (inflight.peek("acme").pending, seed.peek("acme").pending) == (0, 0)
    assert seed.reset("acme") is False, "nothing left in either mode"


def test_status_is_not_cut_to_80_columns_when_piped(
    cli: Callable[..., Result], counter_url: str, key_prefix: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    router = PriorityRouter(redis_url=counter_url, key_prefix=key_prefix, mode="inflight")
    client = "a-client-id-longer-than-a-narrow-column-0001"
    router.record(client, "t1")
    router.set_tier(client, max_in_flight=3, borrow=True, rate="10/m")
    # CliRunner's output is not a terminal, as a pipe is not; COLUMNS unset, as in a cron job.
    monkeypatch.delenv("COLUMNS", raising=False)
    table = cli("--mode", "inflight", "status").output
    header = next(line for line in table.splitlines() if "client" in line and "pending" in line)
    cells = [c.strip() for c in header.strip("┃ ").split("┃")]
    assert cells == [
        *("client", "pending", "priority", "since update", "until reset", "in flight"),
        *("running", "held", "limits"),
    ]
    row = next(line for line in table.splitlines() if client in line)
    assert "max_in_flight=3 borrow rate=10/m" in row, "a row is one line"
    router.unset_tier(client)


def test_status_says_how_many_are_tracked_and_shown(
    cli: Callable[..., Result], router: PriorityRouter
) -> None:
    limited = cli("status", "--limit", "1")
    assert "3 client(s) tracked in the seed mode, 1 shown" in limited.output
    cli("reset", "--all", "--yes")
    empty = cli("status").output
    assert "0 client(s) tracked in the seed mode" in empty
    assert "--mode inflight" in empty, "an empty listing names the other mode"


def test_an_empty_status_under_an_unused_prefix_names_the_prefixes_the_store_holds(
    counter_url: str, key_prefix: str, router: PriorityRouter
) -> None:
    """A FastAPI trial's prefix lived in a .env file the CLI never read: the listing was
    empty and the hint named the other counting mode, not the prefix."""
    unused = f"{key_prefix}typo:"
    result = CliRunner().invoke(main, ["--redis-url", counter_url, "--key-prefix", unused, "status"])
    assert result.exit_code == 0, result.output
    said = " ".join(result.output.split())  # the console wraps at 80 columns
    assert "0 client(s) tracked" in said
    assert f"no router has used key prefix {unused!r} here; this store holds keys under" in said
    assert repr(key_prefix) in said and "--key-prefix PREFIX" in said


def test_the_app_option_goes_before_or_after_the_subcommand(
    counter_url: str, key_prefix: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "cli_app_module.py").write_text(
        "from celery import Celery\n"
        "from priority_router import PriorityRouter\n"
        "app = Celery('cli-app', broker='memory://', set_as_current=False)\n"
        f"PriorityRouter(redis_url={counter_url!r}, key_prefix={key_prefix!r}).install(app)\n"
    )
    monkeypatch.chdir(tmp_path)
    PriorityRouter(redis_url=counter_url, key_prefix=key_prefix).record("via-app")
    runner = CliRunner()
    for args in (["-A", "cli_app_module", "status", "--json"], ["status", "-A", "cli_app_module", "--json"]):
        result = runner.invoke(main, args)
        assert result.exit_code == 0, (args, result.output)
        assert [r["client_id"] for r in json.loads(result.output)] == ["via-app"]
    missing = runner.invoke(main, ["doctor"])
    assert missing.exit_code == 2 and "Missing option '-A'" in missing.output


def test_status_and_inspect_name_the_table_and_say_when_clients_share_its_last_row(
    cli: Callable[..., Result], router: PriorityRouter, counter_url: str, key_prefix: str
) -> None:
    alone = cli("status")
    assert alone.exit_code == 0, alone.output
    assert "threshold table: default" in alone.output
    assert "last row" not in alone.output  # bulk is there alone
    for _ in range(40):
        router.record("medium")
    shared = cli("status")
    assert shared.exit_code == 0, shared.output
    text = " ".join(shared.output.split())
    assert "2 clients (bulk, medium) share the table's last row (pending < -20, priority 9)" in text
    assert "67 documents counted" in text
    assert 'thresholds="wide"' in text and "simulate TRACE --thresholds wide" in text
    assert "`priority-router simulate TRACE --tune` fits a table to it" in text
    # PRIORITY_ROUTER_THRESHOLDS=wide: the same counts are far from its last row.
    runner = CliRunner()
    args = ["--redis-url", counter_url, "--key-prefix", key_prefix]
    wide = runner.invoke(main, [*args, "status"], env={"PRIORITY_ROUTER_THRESHOLDS": "wide"})
    assert wide.exit_code == 0, wide.output
    assert "threshold table: wide" in wide.output and "last row" not in wide.output
    row = json.loads(
        runner.invoke(
            main, [*args, "inspect", "medium", "--json"], env={"PRIORITY_ROUTER_THRESHOLDS": "wide"}
        ).output
    )
    assert (row["pending"], row["priority"], row["thresholds"]) == (-44, 3, "wide")


def test_a_bad_router_setting_stops_every_command_with_dash_a(
    counter_url: str, key_prefix: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, redis_server_url: str
) -> None:
    """A Django project's bad CELERY_PRIORITY_ROUTER_MODE: the commands refuse, naming it,
    instead of reading the default store; doctor blames it and nothing else."""
    from support.services import broker_db_url

    def project(mode: str) -> None:
        (tmp_path / "djsettings.py").write_text(
            f"CELERY_BROKER_URL = {broker_db_url(redis_server_url)!r}\n"
            f"CELERY_PRIORITY_ROUTER_REDIS_URL = {counter_url!r}\n"
            f"CELERY_PRIORITY_ROUTER_KEY_PREFIX = {key_prefix!r}\n"
            f"CELERY_PRIORITY_ROUTER_MODE = {mode!r}\n"
        )
        (tmp_path / "djapp.py").write_text(
            "from celery import Celery\n"
            "from priority_router import PriorityRouter\n"
            "app = Celery('djapp', set_as_current=False)\n"
            "PriorityRouter().install(app)\n"
            "app.config_from_object('djsettings', namespace='CELERY')\n"
        )
        for name in ("djapp", "djsettings"):
            sys.modules.pop(name, None)

    monkeypatch.chdir(tmp_path)
    PriorityRouter(redis_url=counter_url, key_prefix=key_prefix, mode="inflight").record("acme", "t1")
    project("in-flight")
    runner = CliRunner()
    named = "CELERY_PRIORITY_ROUTER_MODE: 'in-flight' is not a counting mode. Fix: use one of seed, inflight"
    for args in (["status"], ["inspect", "acme"], ["tier", "list"], ["queues"], ["reset", "acme", "--yes"]):
        result = runner.invoke(main, ["-A", "djapp", *args])
        assert result.exit_code == 2, (args, result.output)
        assert named in result.stderr, (args, result.stderr)
        assert "redis://localhost:6379/0" not in result.output
    doctor = runner.invoke(main, ["-A", "djapp", "doctor", "--json"])
    assert doctor.exit_code == 1
    (finding,) = json.loads(doctor.stdout)
    assert (finding["check"], finding["ok"]) == ("router", False)
    assert "CELERY_PRIORITY_ROUTER_MODE: 'in-flight' is not a counting mode" in finding["detail"]
    assert "use one of seed, inflight" in finding["fix"]

    project("inflight")  # fixed: the app's own store, its valid settings and all
    result = runner.invoke(main, ["-A", "djapp", "status", "--json"])
    assert result.exit_code == 0, result.output
    assert [(r["client_id"], r["in_flight"]) for r in json.loads(result.stdout)] == [("acme", 1)]


def test_status_shows_fractional_costs_as_counted(
    cli: Callable[..., Result], counter_url: str, key_prefix: str
) -> None:
    """Documents in flight at cost 0.31: status showed pending 0.69 (positive) and in flight
    0.31000000000000005."""
    publisher = PriorityRouter(counter_url, key_prefix=key_prefix, mode="inflight")
    publisher.record("light", "t1", cost=0.31)
    publisher.record("heavy", "t2", cost=2.2)
    publisher.record("heavy", "t3", cost=0.1)
    rows = {r["client_id"]: r for r in json.loads(cli("status", "--mode", "inflight", "--json").output)}
    assert (rows["light"]["pending"], rows["light"]["in_flight"]) == (0, 0.31)
    assert rows["heavy"]["in_flight"] == 2.3 and rows["heavy"]["pending"] < 0
    table = cli("status", "--mode", "inflight")
    assert table.exit_code == 0, table.output
    assert "0.31 " in table.output and "0.69" not in table.output
    assert "0000" not in table.output and "9999" not in table.output


@pytest.mark.parametrize("command", [["status"], ["status", "--json"], ["inspect", "acme"], ["tier", "list"]])
def test_a_stopped_store_fails_the_command_at_once_saying_so(command: list[str], key_prefix: str) -> None:
    """A store stopped with SIGSTOP (a soak's fault) accepts connections and never answers:
    status waited out its 5 s read timeout and printed only the client's TimeoutError.  It
    now asks a PING first, as doctor does, and names the likely causes and the fix."""
    store = start_embedded_redis()
    PriorityRouter(store.url + "/0", key_prefix=key_prefix).record("acme")
    os.kill(store.process.pid, signal.SIGSTOP)
    try:
        store_options = ["--redis-url", store.url + "/0", "--key-prefix", key_prefix]
        done = subprocess.run(
            [sys.executable, "-m", "priority_router", *store_options, *command],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
    finally:
        os.kill(store.process.pid, signal.SIGCONT)
        store.stop()
    assert done.returncode == 1, done.stdout + done.stderr
    assert f"the counter store at {store.url}/0 does not answer within 1 s" in done.stderr
    assert "stopped, paused or unreachable. Fix: start or resume it" in done.stderr
    if "--json" in command:
        assert "does not answer" in json.loads(done.stdout)["error"]
