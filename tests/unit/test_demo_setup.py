"""``priority-router demo``'s choices that need no worker: which Redis, and the report
without matplotlib (``tests/integration/test_demo.py`` runs it end to end)."""

from __future__ import annotations

import io
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner
from rich.console import Console

from priority_router.demo import run
from priority_router.demo.local_redis import free_port
from priority_router.ops.cli import main


def nowhere() -> str:
    return f"redis://127.0.0.1:{free_port()}"


def test_a_redis_url_that_does_not_answer_is_an_error_that_names_the_fix() -> None:
    url = nowhere()
    with pytest.raises(SystemExit) as stopped, run.redis_for_demo(url, "REDIS_URL"):
        pass
    message = str(stopped.value.code)
    assert f"no Redis answers at {url} (from REDIS_URL)" in message
    assert "pass --redis-url" in message


def test_with_no_redis_and_no_redis_server_program_the_demo_says_what_to_do(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(run, "redis_server_program", lambda: None)
    with pytest.raises(SystemExit) as stopped, run.redis_for_demo(local=nowhere()):
        pass
    message = str(stopped.value.code)
    assert "no redis-server program is on PATH" in message
    assert "start redis-server" in message and "--redis-url redis://HOST:PORT" in message


def _result(mode: str, light: float, heavy: float) -> run.RunResult:
    result = run.RunResult(mode, makespan=2.0)
    result.waits = {"light": [light, light * 2], "heavy": [heavy, heavy * 2]}
    return result


def test_without_matplotlib_the_report_prints_the_table_and_the_fix_once(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    out = io.StringIO()
    monkeypatch.setattr(run, "console", Console(file=out, width=120))
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib: ImportError
    chart = tmp_path / "demo.png"
    run.report(_result("plain", 0.5, 0.6), _result("router", 0.01, 0.7), chart)
    text = out.getvalue()
    assert "plain Celery" in text and "with priority-router" in text
    assert text.count("the chart needs matplotlib (pip install 'priority-router[plot]')") == 1
    assert "Chart:" not in text
    assert not chart.exists()


@pytest.mark.parametrize(
    ("args", "env", "expected"),
    [
        (["demo"], {}, (None, "REDIS_URL")),
        (["demo"], {"REDIS_URL": "redis://env:6379/3"}, ("redis://env:6379/3", "REDIS_URL")),
        (
            ["demo", "--redis-url", "redis://typed:6379"],
            {"REDIS_URL": "redis://env"},
            ("redis://typed:6379", "--redis-url"),
        ),
        # Before the subcommand, as the other commands take it: it counts too.
        (
            ["--redis-url", "redis://group:6379", "demo"],
            {"REDIS_URL": "redis://env"},
            ("redis://group:6379", "--redis-url"),
        ),
    ],
)
def test_the_demos_redis_comes_from_redis_url(
    monkeypatch: pytest.MonkeyPatch, args: list[str], env: dict[str, str], expected: tuple[str | None, str]
) -> None:
    seen: list[tuple[str | None, str]] = []

    def fake_run_demo(workload: run.Workload, chart: Path, redis_url: str | None, source: str) -> int:
        seen.append((redis_url, source))
        return 0

    monkeypatch.setattr(run, "run_demo", fake_run_demo)
    monkeypatch.delenv("REDIS_URL", raising=False)
    monkeypatch.delenv("PRIORITY_ROUTER_REDIS_URL", raising=False)
    result = CliRunner().invoke(main, args, env=env)
    assert result.exit_code == 0, result.output
    assert seen == [expected]
