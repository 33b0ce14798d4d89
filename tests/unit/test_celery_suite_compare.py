"""compare.py, the Celery suite's judge of router regressions: a suspect run alone fails
with the router and passes without it every time before it is called a regression, and
a busy spell of the machine falls on both modes alike (issue #46: a timing-sensitive test
that fails now and then without the router was reported as a regression when its two
runs with the router came before its two without)."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[2]
NODE = "t/integration/test_tasks.py::test_task_replacement::test_replaced_task_nesting_level_0"


def load_compare() -> ModuleType:
    spec = importlib.util.spec_from_file_location(
        "celery_suite_compare", ROOT / "tests/celery_suite/compare.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def junit(path: Path, mode: str, outcome: str) -> Path:
    inner = '<failure message="assert False"/>' if outcome == "failed" else ""
    path.write_text(
        f'<testsuites><testsuite name="celery-suite-redis-{mode}">'
        '<testcase classname="t.integration.test_tasks.test_task_replacement" '
        f'name="test_replaced_task_nesting_level_0">{inner}</testcase>'
        "</testsuite></testsuites>"
    )
    return path


def judge(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    outcome_of_run: object,
) -> tuple[int, str, list[bool]]:
    """compare.py on a suspect, each run alone answered by ``outcome_of_run(n, with_router)``."""
    compare = load_compare()
    modes: list[bool] = []

    def rerun(broker: str, node: str, with_router: bool, attempt: int) -> str:
        assert (broker, node) == ("redis", NODE)
        modes.append(with_router)
        return outcome_of_run(len(modes), with_router)  # type: ignore[operator,no-any-return]

    monkeypatch.setattr(compare, "rerun", rerun)
    status = compare.main(
        [
            str(junit(tmp_path / "base.xml", "baseline", "passed")),
            str(junit(tmp_path / "router.xml", "router", "failed")),
        ]
    )
    return status, capsys.readouterr().out, modes


def test_a_busy_spell_is_not_taken_for_a_regression(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # The test fails whatever the mode while the machine is busy (the first two runs),
    # and passes once it is quiet: nothing about the router.
    status, out, modes = judge(
        tmp_path, monkeypatch, capsys, lambda n, with_router: "failed" if n <= 2 else "passed"
    )
    assert status == 0
    assert "not confirmed" in out and "router regressions (redis): 0" in out
    # Five runs each way, alternating, each pair in turn starting with the other mode.
    assert modes == [True, False, False, True, True, False, False, True, True, False]


def test_a_test_failing_only_with_the_router_is_a_regression(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    status, out, modes = judge(
        tmp_path, monkeypatch, capsys, lambda n, with_router: "failed" if with_router else "passed"
    )
    assert status == 1
    assert f"router regressions (redis): 1\n  {NODE}" in out
    assert modes.count(True) == modes.count(False) == 5
