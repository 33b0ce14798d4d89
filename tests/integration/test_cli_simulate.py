"""``priority-router simulate`` as a user runs it: tables, JSON, the chart and bad input."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from click.testing import CliRunner, Result

from priority_router.ops.cli import main

PNG = b"\x89PNG\r\n\x1a\n"
TRACE = "timestamp,client_id,duration\n0,heavy,1\n0,heavy,1\n0,heavy,1\n0,heavy,1\n0.5,light,1\n"


@pytest.fixture
def cli() -> Callable[..., Result]:
    runner = CliRunner()

    def invoke(*args: str, env: dict[str, str] | None = None) -> Result:
        return runner.invoke(main, list(args), env={"PRIORITY_ROUTER_MAX_WAIT": None, **(env or {})})

    return invoke


@pytest.fixture
def trace(tmp_path: Path) -> Path:
    path = tmp_path / "trace.csv"
    path.write_text(TRACE)
    return path


def test_tables_compare_every_policy_on_a_built_in_workload(cli: Callable[..., Result]) -> None:
    result = cli("simulate", "--workload", "noisy-neighbour", "--workers", "4")
    assert result.exit_code == 0, result.output
    out = result.output
    assert "workload noisy-neighbour: 184 documents, 13 clients, 4 workers" in out
    for policy in ("fifo", "seed", "inflight", "drr"):
        assert f"{policy}: makespan" in out
    assert "seed+max_wait: makespan" not in out
    assert "need --max-wait SECONDS: left out" in out
    assert "light00" in out and "p95 wait" in out and "Jain" in out
    assert "Waits by client group" in out


def test_a_policy_table_lists_the_longest_waits_first_when_clients_are_many(
    cli: Callable[..., Result],
) -> None:
    result = cli("simulate", "--workload", "noisy-neighbour", "--policies", "fifo", "--clients", "3")
    assert result.exit_code == 0, result.output
    assert "the 3 clients with the longest p95 wait of 13" in " ".join(result.output.split())
    table = result.output.split("fifo: makespan")[1]
    assert sum(1 for line in table.splitlines() if "│ light" in line or "│ heavy" in line) == 3


def test_json_is_exactly_policy_makespan_jain_and_per_client_waits(
    cli: Callable[..., Result], trace: Path
) -> None:
    result = cli("simulate", str(trace), "--workers", "1", "--json")
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert list(data) == ["fifo", "seed", "inflight", "drr"]
    for policy in data.values():
        assert set(policy) == {"makespan", "jain", "per_client"}
        assert set(policy["per_client"]) == {"heavy", "light"}
        for client in policy["per_client"].values():
            assert set(client) == {"documents", "p50_wait", "p95_wait", "max_wait"}
    assert data["fifo"]["makespan"] == 5
    assert data["fifo"]["per_client"] == {
        "heavy": {"documents": 4, "p50_wait": 1.5, "p95_wait": 2.85, "max_wait": 3.0},
        "light": {"documents": 1, "p50_wait": 3.5, "p95_wait": 3.5, "max_wait": 3.5},
    }
    # The router: light's priority-1 document goes before heavy's 4th (priority 2);
    # DRR: light gets the turn after heavy's second document.
    assert data["seed"]["per_client"]["light"]["max_wait"] == 2.5
    assert data["seed"]["per_client"]["heavy"]["max_wait"] == 4.0
    assert data["drr"]["per_client"]["light"]["max_wait"] == 1.5
    assert 0 < data["seed"]["jain"] <= 1

    slower = json.loads(cli("simulate", str(trace), "--workers", "1", "--json", "--overhead", "0.5").stdout)
    assert slower["fifo"]["makespan"] == 7.5  # five documents, each 0.5 s later than the last
    assert slower["fifo"]["per_client"]["light"]["max_wait"] == 6.0  # starts at 6.5


def test_max_wait_adds_the_bounded_policies_from_the_option_or_the_environment(
    cli: Callable[..., Result], trace: Path
) -> None:
    given = json.loads(cli("simulate", str(trace), "--workers", "1", "--json", "--max-wait", "1").stdout)
    from_env = json.loads(
        cli("simulate", str(trace), "--workers", "1", "--json", env={"PRIORITY_ROUTER_MAX_WAIT": "1"}).stdout
    )
    assert list(given) == ["fifo", "seed", "seed+max_wait", "inflight", "inflight+max_wait", "drr"]
    assert given == from_env
    # heavy's 4th document is overdue at 1 s and swept ahead of light's at 1.25 s.
    assert given["seed+max_wait"]["per_client"]["light"]["max_wait"] == 3.5


def test_thresholds_and_reset_interval_change_the_router_policies(
    cli: Callable[..., Result], tmp_path: Path
) -> None:
    path = tmp_path / "spell.csv"
    # heavy sends 6 short documents, then one more 20 s later, next to medium's five
    # (priorities 1, 1, 1, 2, 2) that wait for a blocker: heavy's 7th goes after medium's
    # third (priority 1) or after its fifth.
    rows = ["0,heavy,0.1"] * 6 + ["20,blocker,1"] + ["20.1,medium,1"] * 5 + ["20.2,heavy,1"]
    path.write_text("timestamp,client_id,duration\n" + "\n".join(rows) + "\n")

    def heavy_max(*options: str, before: tuple[str, ...] = ()) -> float:
        result = cli(*before, "simulate", str(path), "--workers=1", "--json", "--policies=seed", *options)
        assert result.exit_code == 0, result.output
        return float(json.loads(result.stdout)["seed"]["per_client"]["heavy"]["max_wait"])

    assert heavy_max() == pytest.approx(5.8)  # pending -6: priority 3
    assert heavy_max("--reset-interval", "10") == pytest.approx(3.8)  # idle 20 s: reset, priority 1
    assert heavy_max(before=("--reset-interval", "10")) == pytest.approx(3.8)  # the group's option too
    # The table as given: -6 < -5 is priority 1 again, medium's -3 and -4 stay at 2.
    assert heavy_max("--thresholds=-5:1,-2:2") == pytest.approx(3.8)
    assert heavy_max("--thresholds", "-5:9,-2:2,fallback:1") == pytest.approx(5.8)


def test_plot_writes_a_png_of_the_waits(cli: Callable[..., Result], tmp_path: Path) -> None:
    chart = tmp_path / "waits.png"
    result = cli("simulate", "--workload", "heavy-mix", "--max-wait", "1", "--plot", str(chart))
    assert result.exit_code == 0, result.output
    assert f"Chart: {chart}" in result.output
    assert chart.read_bytes().startswith(PNG) and chart.stat().st_size > 10_000
    assert [p.name for p in tmp_path.iterdir()] == ["waits.png"]


def test_plot_without_matplotlib_names_the_extra_and_writes_nothing(
    cli: Callable[..., Result], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    chart = tmp_path / "waits.png"
    result = cli("simulate", "--workload", "heavy-mix", "--plot", str(chart))
    assert result.exit_code == 2
    assert "pip install 'priority-router[plot]'" in result.output
    assert not chart.exists()


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ((), "give a TRACE file or --workload NAME"),
        (("--workload", "heavy-mix", "TRACE"), "give a TRACE file or --workload NAME"),
        (("TRACE", "--seed", "3"), "a TRACE file has its own"),
        (("TRACE", "--policies", "seed+max_wait"), "add --max-wait SECONDS"),
        (("TRACE", "--policies", "fifo,lifo"), "lifo is not a policy"),
        (("TRACE", "--thresholds", "-2:2,-20:9"), "not strictly increasing"),
        (("TRACE", "--thresholds", "deep"), "'deep' is not LIMIT:PRIORITY"),
        (("TRACE", "--thresholds", "fallback:1,-2:2"), "must come last"),
        (("TRACE", "--thresholds", "-2:12"), "outside 1..9"),
        (("TRACE", "--reset-interval", "0.5"), "--reset-interval"),
        (("TRACE", "--max-wait", "0"), "--max-wait"),
        (("TRACE", "--workers", "0"), "--workers"),
        (("TRACE", "--quantum", "-1"), "--quantum"),
        (("TRACE", "--overhead", "-0.001"), "--overhead"),
        (("TRACE", "--plot", "waits.nope"), "end the name with .png"),
        (("--workload", "tidal"), "'tidal' is not one of"),
    ],
)
def test_bad_options_exit_2_naming_the_problem(
    cli: Callable[..., Result], trace: Path, args: tuple[str, ...], message: str
) -> None:
    result = cli("simulate", *(str(trace) if a == "TRACE" else a for a in args))
    assert result.exit_code == 2, result.output
    assert message in " ".join(result.output.split())


def test_a_bad_trace_line_is_named_and_nothing_is_written(cli: Callable[..., Result], tmp_path: Path) -> None:
    bad = tmp_path / "bad.csv"
    bad.write_text("timestamp,client_id,duration\n0,a,0.5\n0.1,b,fast\n")
    chart = tmp_path / "waits.png"
    result = cli("simulate", str(bad), "--plot", str(chart))
    assert result.exit_code == 2
    assert "line 3: duration 'fast' is not a positive number of seconds" in " ".join(result.output.split())
    assert not chart.exists()


def test_the_installed_program_runs_it(tmp_path: Path, trace: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "priority_router", "--reset-interval", "2", "simulate", str(trace), "--json"],
        capture_output=True,
        text=True,
        timeout=120,
        env={"PATH": "/usr/bin:/bin"},
    )
    assert done.returncode == 0, done.stderr
    assert set(json.loads(done.stdout)) == {"fifo", "seed", "inflight", "drr"}
