"""``priority-router simulate`` as a user runs it: tables, JSON, the chart, tiers and bad input."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner, Result

from priority_router.ops.cli import main

PNG = b"\x89PNG\r\n\x1a\n"
TRACE = "timestamp,client_id,duration\n0,heavy,1\n0,heavy,1\n0,heavy,1\n0,heavy,1\n0.5,light,1\n"


@pytest.fixture
def cli() -> Callable[..., Result]:
    runner = CliRunner()

    def invoke(*args: str, env: dict[str, str | None] | None = None) -> Result:
        base: dict[str, str | None] = {"PRIORITY_ROUTER_MAX_WAIT": None, "PRIORITY_ROUTER_TIERS": None}
        return runner.invoke(main, list(args), env={**base, **(env or {})})

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


def test_json_is_exactly_policy_makespan_jain_overtakes_and_per_client_waits(
    cli: Callable[..., Result], trace: Path
) -> None:
    result = cli("simulate", str(trace), "--workers", "1", "--json")
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert list(data) == ["fifo", "seed", "inflight", "drr"]
    for policy in data.values():
        assert set(policy) == {"makespan", "jain", "overtakes", "per_client"}
        assert set(policy["per_client"]) == {"heavy", "light"}
        for client in policy["per_client"].values():
            assert set(client) == {"documents", "p50_wait", "p95_wait", "max_wait", "overtakes"}
        assert policy["overtakes"] == 0
    assert data["fifo"]["makespan"] == 5
    assert data["fifo"]["per_client"] == {
        "heavy": {"documents": 4, "p50_wait": 1.5, "p95_wait": 2.85, "max_wait": 3.0, "overtakes": 0},
        "light": {"documents": 1, "p50_wait": 3.5, "p95_wait": 3.5, "max_wait": 3.5, "overtakes": 0},
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
    # The table as given: -6 is under no limit but -7's, priority 2 with medium's -3 and -4.
    assert heavy_max("--thresholds=-7:3,-2:2,fallback:1") == pytest.approx(5.8)
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
        (("TRACE", "--thresholds", "deep"), "'deep' is neither a table's name nor a LIMIT:PRIORITY row"),
        (("TRACE", "--thresholds", "fallback:1,-2:2"), "'fallback:1' is not last"),
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


# -- tiers: --tier, --default-tier, --tiers FILE ------------------------------------


def light_max(cli: Callable[..., Result], trace: Path, *options: str) -> dict[str, Any]:
    """Each policy's longest wait of light, on one slot."""
    result = cli("simulate", str(trace), "--workers", "1", "--json", "--max-wait", "2.2", *options)
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    return {policy: data[policy]["per_client"]["light"]["max_wait"] for policy in data}


def test_tiers_change_the_router_policies_and_not_fifo_or_drr(
    cli: Callable[..., Result], trace: Path
) -> None:
    plain = light_max(cli, trace)
    # The table: light's priority-1 document goes before heavy's 4th (priority 2).
    assert plain["seed"] == plain["inflight"] == 2.5
    # heavy all at 1: the router's lists are first in first out, light goes last.
    heavy_first = light_max(cli, trace, "--tier", "heavy=fixed=1")
    assert heavy_first["seed"] == heavy_first["inflight"] == heavy_first["fifo"] == 3.5
    # Everyone at 9 by default but light, exempt by a neutral tier of its own: light next.
    exempt = light_max(cli, trace, "--default-tier", "fixed=9", "--tier", "light=neutral")
    assert exempt["seed"] == exempt["inflight"] == 0.5
    # shift=1: heavy's 2nd document is already at 2, so light goes right after the first.
    assert light_max(cli, trace, "--tier", "heavy=shift=1")["seed"] == 0.5
    for tiered in (heavy_first, exempt):
        assert tiered["fifo"] == plain["fifo"] and tiered["drr"] == plain["drr"], "no priorities, no tiers"
        assert (
            set(tiered)
            == set(plain)
            == {"fifo", "seed", "seed+max_wait", "inflight", "inflight+max_wait", "drr"}
        )
    # With max_wait 2.2 the sweep at 2.2 moves heavy's overdue 4th document (priority 2) to
    # step 0, ahead of light: 3.5.  Light exempt and heavy at 9 by default: light next, 0.5.
    assert plain["seed+max_wait"] == plain["inflight+max_wait"] == 3.5
    assert exempt["seed+max_wait"] == exempt["inflight+max_wait"] == 0.5


def test_a_tiers_file_gives_the_same_and_tier_wins_over_it(
    cli: Callable[..., Result], trace: Path, tmp_path: Path
) -> None:
    tiers = tmp_path / "tiers.csv"
    tiers.write_text("client_id,weight,shift,fixed\nheavy,,1,\nlight,,,9\n")
    from_file = light_max(cli, trace, "--tiers", str(tiers))
    assert from_file["seed"] == 3.5  # light at 9: behind all of heavy's (2, 2, 2, 3)
    assert from_file == light_max(cli, trace, "--tier", "heavy=shift=1", "--tier", "light=fixed=9")
    # --tier wins for light (back to the table's 1); heavy keeps the file's shift: light next.
    assert light_max(cli, trace, "--tiers", str(tiers), "--tier", "light=neutral")["seed"] == 0.5


def test_the_tables_say_which_tiers_ran_and_what_they_cannot_change(
    cli: Callable[..., Result], trace: Path
) -> None:
    result = cli(
        "simulate",
        str(trace),
        "--policies",
        "fifo,seed,drr",
        "--tier",
        "heavy=weight=2,shift=-1",
        "--tier",
        "default=fixed=9",
        "--default-tier",
        "shift=1",
    )
    assert result.exit_code == 0, result.output
    out = " ".join(result.output.split())
    assert "tiers for 2 client(s), default tier shift=1" in out
    assert "tiers for client(s) not in the trace change nothing: 'default'" in out
    assert "(the default tier is --default-tier TIER)" in out
    assert "fifo and drr ignore tiers (no priorities)" in out
    quiet = cli("simulate", str(trace), "--policies", "seed", "--tier", "heavy=fixed=1")
    assert "ignore" not in quiet.output and "not in the trace" not in quiet.output


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("--tier", "heavy"), "Invalid value for '--tier': 'heavy' is not CLIENT=TIER"),
        (("--tier", "heavy=weight=0"), "Invalid value for '--tier': heavy: tier weight: 0.0 is not above 0"),
        (("--tier", "heavy=fixed=1,shift=1"), "give either fixed, or weight and/or shift"),
        (("--tier", "heavy=speed=2"), "'speed=2' is not weight=W, shift=S or fixed=P; write e.g."),
        (("--tier", "heavy=fixed=1", "--tier", "heavy=fixed=2"), "'heavy' is given twice"),
        (("--default-tier", "shift=12"), "Invalid value for '--default-tier': tier shift"),
        (("--default-tier", "neutral"), "a neutral default tier changes nothing"),
        (("--default-tier", "weight=heavy"), "weight 'heavy' is not a number"),
        (("--tiers", "missing.csv"), "Invalid value for '--tiers': File 'missing.csv' does not exist"),
    ],
)
def test_bad_tiers_exit_2_naming_the_option_and_the_fix(
    cli: Callable[..., Result], trace: Path, args: tuple[str, ...], message: str
) -> None:
    result = cli("simulate", str(trace), *args)
    assert result.exit_code == 2, result.output
    assert message in " ".join(result.output.split())


def test_a_bad_tiers_file_line_is_named(cli: Callable[..., Result], trace: Path, tmp_path: Path) -> None:
    tiers = tmp_path / "tiers.csv"
    tiers.write_text("client_id,weight,shift,fixed\nheavy,,,1\nlight,2,,5\n")
    result = cli("simulate", str(trace), "--tiers", str(tiers))
    assert result.exit_code == 2
    assert "Invalid value for '--tiers': line 3: tier: fixed=5" in " ".join(result.output.split())


def test_tiers_off_in_the_environment_refuses_tier_options(cli: Callable[..., Result], trace: Path) -> None:
    result = cli("simulate", str(trace), "--tier", "heavy=fixed=1", env={"PRIORITY_ROUTER_TIERS": "false"})
    assert result.exit_code == 2
    assert "PRIORITY_ROUTER_TIERS turns tiers off" in result.output
    assert cli("simulate", str(trace), "--json", env={"PRIORITY_ROUTER_TIERS": "false"}).exit_code == 0


def test_a_chart_into_a_missing_folder_is_refused_before_simulating(
    cli: Callable[..., Result], trace: Path, tmp_path: Path
) -> None:
    target = tmp_path / "no-such-folder" / "waits.png"
    result = cli("simulate", str(trace), "--plot", str(target))
    assert result.exit_code == 2, result.output
    assert "does not exist" in result.output and "no-such-folder" in result.output
    assert "Traceback" not in result.output and not target.parent.exists()


# -- counting by cost: --cost, the cost column, rr -----------------------------------------

COSTED = (
    "timestamp,client_id,duration,cost\n"
    "0,heavy,1,4\n0,heavy,1,4\n0,heavy,1,4\n0,heavy,1,4\n0.5,light,1,\n"  # light: no cost, 1
)


def run_json(cli: Callable[..., Result], *args: str) -> dict[str, Any]:
    result = cli("simulate", *args, "--json")
    assert result.exit_code == 0, result.output
    data: dict[str, Any] = json.loads(result.stdout)
    return data


def test_a_cost_column_is_counted_and_rr_joins_the_ideals(cli: Callable[..., Result], tmp_path: Path) -> None:
    path = tmp_path / "costed.csv"
    path.write_text(COSTED)
    data = run_json(cli, str(path), "--workers", "1")
    assert list(data) == ["fifo", "seed", "inflight", "rr", "drr"]
    # heavy's 2nd document is at -4 (priority 3), so light (priority 1) goes right after the
    # first; by document it went after heavy's priority-1 documents (2.5 s).
    assert data["seed"]["per_client"]["light"]["max_wait"] == 0.5
    assert data["inflight"]["per_client"]["light"]["max_wait"] == 0.5
    # rr: one document per client per turn, light's after heavy's second; drr by cost with
    # the quantum 4, heavy's largest: one of heavy's per turn too.
    assert data["rr"]["per_client"]["light"]["max_wait"] == 1.5
    assert data["drr"]["per_client"]["light"]["max_wait"] == 1.5
    by_document = run_json(cli, str(path), "--workers", "1", "--cost", "document")
    assert by_document["seed"]["per_client"]["light"]["max_wait"] == 2.5
    assert list(by_document) == ["fifo", "seed", "inflight", "drr"]  # every cost 1: as before costs


def test_the_cost_column_of_ones_and_cost_document_change_nothing(
    cli: Callable[..., Result], trace: Path, tmp_path: Path
) -> None:
    ones = tmp_path / "ones.csv"
    ones.write_text(TRACE.replace("duration\n", "duration,cost\n").replace(",1\n", ",1,1\n"))
    before = run_json(cli, str(trace), "--workers", "1", "--max-wait", "1")
    assert run_json(cli, str(ones), "--workers", "1", "--max-wait", "1") == before
    assert run_json(cli, str(trace), "--workers", "1", "--max-wait", "1", "--cost", "document") == before
    # 1 s documents counted by their seconds cost 1 each: the same again.
    assert run_json(cli, str(trace), "--workers", "1", "--max-wait", "1", "--cost", "duration") == before


def test_cost_duration_counts_seconds_on_the_mixed_sizes_workload(cli: Callable[..., Result]) -> None:
    def invoices_worst_p95(data: dict[str, Any], policy: str) -> float:
        clients = data[policy]["per_client"]
        return float(max(w["p95_wait"] for c, w in clients.items() if c.startswith("invoices")))

    by_document = run_json(cli, "--workload", "mixed-sizes", "--policies", "fifo,seed,inflight,rr,drr")
    by_seconds = run_json(cli, "--workload", "mixed-sizes", "--cost", "duration")
    assert list(by_seconds) == ["fifo", "seed", "inflight", "rr", "drr"]
    assert by_seconds["drr"] == by_document["drr"]  # by seconds either way
    for mode in ("seed", "inflight"):
        assert invoices_worst_p95(by_seconds, mode) <= 0.6 * invoices_worst_p95(by_document, mode)
        assert invoices_worst_p95(by_seconds, mode) <= invoices_worst_p95(by_seconds, "drr")
        assert by_seconds[mode]["makespan"] <= 1.05 * by_document["fifo"]["makespan"]


def test_the_heading_says_what_was_counted(cli: Callable[..., Result], trace: Path, tmp_path: Path) -> None:
    path = tmp_path / "costed.csv"
    path.write_text(COSTED)
    column = " ".join(cli("simulate", str(path), "--tier", "heavy=shift=1").output.split())
    assert "cost: the cost column" in column
    assert "fifo, rr and drr ignore tiers (no priorities)" in column
    seconds = " ".join(cli("simulate", "--workload", "mixed-sizes", "--cost", "duration").output.split())
    assert "cost: seconds (--cost duration)" in seconds and " rr: makespan" in seconds
    plain = " ".join(cli("simulate", str(trace)).output.split())
    assert "cost:" not in plain and " rr: makespan" not in plain
    assert " rr: makespan" in " ".join(cli("simulate", str(trace), "--policies", "rr,drr").output.split())


@pytest.mark.parametrize(
    ("content", "args", "message"),
    [
        (
            TRACE,
            ("--cost", "pages"),
            "Invalid value for '--cost': 'pages' is not one of 'column', 'duration'",
        ),
        (TRACE, ("--policies", "rr,lru"), "lru is not a policy; use a comma list of fifo, seed"),
        ("timestamp,client_id,duration\n0,a,2000000\n", ("--cost", "duration"), "a document lasts more than"),
        (
            "timestamp,client_id,duration,cost\n0,a,1,0\n",
            (),
            "line 2: cost 0.0 is not a positive finite number: a document costs more than 0; fix the cost "
            "column, or leave the cell empty for a cost of 1",
        ),
    ],
)
def test_bad_costs_exit_2_naming_the_problem(
    cli: Callable[..., Result], tmp_path: Path, content: str, args: tuple[str, ...], message: str
) -> None:
    path = tmp_path / "trace.csv"
    path.write_text(content)
    result = cli("simulate", str(path), *args)
    assert result.exit_code == 2, result.output
    assert message in " ".join(result.output.split())


# -- limits: max_in_flight, borrow, rate, burst, max_cost_in_flight in the tiers -------------


def gate_of(data: dict[str, Any]) -> dict[str, Any]:
    """Each policy's "limits" (what the gate did), asserting every policy saw the same."""
    found = [policy.get("limits") for policy in data.values()]
    assert all(f == found[0] for f in found), found
    return found[0] or {}


def test_a_cap_holds_heavy_back_under_every_policy(cli: Callable[..., Result], trace: Path) -> None:
    # 4 slots; heavy's 4 documents at 0 would take them all, light's at 0.5 would wait 0.5 s.
    plain = run_json(cli, str(trace))
    assert {p["per_client"]["light"]["max_wait"] for p in plain.values()} == {0.5}
    assert "limits" not in plain["fifo"]
    capped = run_json(cli, str(trace), "--tier", "heavy=max_in_flight=3")
    assert {p["per_client"]["light"]["max_wait"] for p in capped.values()} == {0.0}
    assert {p["per_client"]["heavy"]["max_wait"] for p in capped.values()} == {1.0}
    assert gate_of(capped) == {"heavy": {"max_running": 3, "held": 1, "held_seconds": 1.0}}
    # Borrowing: the idle 4th slot is lent at the first tick (0.25), so light waits again.
    borrowing = run_json(cli, str(trace), "--tier", "heavy=max_in_flight=3,borrow")
    assert {p["per_client"]["light"]["max_wait"] for p in borrowing.values()} == {0.5}
    assert gate_of(borrowing) == {"heavy": {"max_running": 4, "held": 1, "held_seconds": 0.25}}
    # With priorities too, and from a tiers file's limit columns: the same.
    weighted = run_json(cli, str(trace), "--tier", "heavy=weight=2,max_in_flight=3")
    assert gate_of(weighted) == gate_of(capped)


def test_a_rate_and_the_gate_tick(cli: Callable[..., Result], trace: Path) -> None:
    # 2/s with a bucket of 2: two start at 0, a token is due every 0.5 s, released at the tick.
    rated = run_json(cli, str(trace), "--tier", "heavy=rate=2/s,burst=2")
    assert gate_of(rated) == {"heavy": {"max_running": 3, "held": 2, "held_seconds": 1.5}}
    assert {p["per_client"]["light"]["max_wait"] for p in rated.values()} == {0.0}
    # Ticks every second: the tokens due at 0.5 and 1 wait for heavy's first end at 1, which
    # releases both (an end releases at once, while h1 still runs: 3 at once).
    slow_tick = run_json(cli, str(trace), "--tier", "heavy=rate=2/s,burst=2", "--gate-tick", "1")
    assert gate_of(slow_tick) == {"heavy": {"max_running": 3, "held": 2, "held_seconds": 2.0}}


def test_a_default_tier_and_a_tiers_file_give_limits(
    cli: Callable[..., Result], trace: Path, tmp_path: Path
) -> None:
    default = run_json(cli, str(trace), "--default-tier", "max_in_flight=2")
    assert gate_of(default) == {
        "heavy": {"max_running": 2, "held": 2, "held_seconds": 2.0},
        "light": {"max_running": 1, "held": 0, "held_seconds": 0.0},
    }
    tiers = tmp_path / "tiers.csv"
    tiers.write_text("client_id,weight,shift,fixed,max_in_flight,borrow\nheavy,,,,3,true\n")
    assert run_json(cli, str(trace), "--tiers", str(tiers)) == run_json(
        cli, str(trace), "--tier", "heavy=max_in_flight=3,borrow"
    )
    cost = run_json(cli, str(trace), "--tier", "heavy=max_cost_in_flight=2")  # every cost 1: 2 at once
    assert gate_of(cost)["heavy"]["max_running"] == 2


def test_the_tables_show_what_the_gate_did(cli: Callable[..., Result], trace: Path) -> None:
    result = cli("simulate", str(trace), "--tier", "heavy=max_in_flight=3,borrow")
    assert result.exit_code == 0, result.output
    out = " ".join(result.output.split())
    assert "tiers for 1 client(s), gate tick 0.25 s" in out
    assert "Limits: what the workers' gate did" in out
    assert "max running" in out and "time held" in out and "max_in_flight=3 borrow" in out
    assert "ignore tiers" not in out, "limits alone: nothing to ignore"
    mixed = " ".join(cli("simulate", str(trace), "--tier", "heavy=shift=1,max_in_flight=3").output.split())
    assert "fifo and drr ignore tiers' priorities (no priorities; limits apply)" in mixed
    plain = " ".join(cli("simulate", str(trace)).output.split())
    assert "Limits:" not in plain and "gate tick" not in plain


def test_the_slow_neighbour_capped_at_3_leaves_light_clients_a_slot(cli: Callable[..., Result]) -> None:
    def light_longest(data: dict[str, Any]) -> float:
        return max(
            w["max_wait"] for p in data.values() for c, w in p["per_client"].items() if c.startswith("light")
        )

    assert light_longest(run_json(cli, "--workload", "slow-neighbour")) > 40
    assert (
        light_longest(run_json(cli, "--workload", "slow-neighbour", "--tier", "heavy=max_in_flight=3")) == 0
    )


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("--tier", "heavy=borrow"), "heavy: borrow: borrow=True lets a capped client run beyond its cap"),
        (("--tier", "heavy=max_in_flight=0"), "heavy: max_in_flight: 0 is not a whole number of documents"),
        (("--tier", "heavy=burst=5"), "burst: a burst is the size of a rate's bucket, but no rate is given"),
        (
            ("--default-tier", "rate=5"),
            "Invalid value for '--default-tier': rate: '5' is not R/s, R/m or R/h",
        ),
        (("--tier", "heavy=cap=3"), "or a limit: max_in_flight=3, borrow, rate=5/s"),
        (("--gate-tick", "0"), "--gate-tick"),
    ],
)
def test_bad_limits_exit_2_naming_the_option_and_the_fix(
    cli: Callable[..., Result], trace: Path, args: tuple[str, ...], message: str
) -> None:
    result = cli("simulate", str(trace), *args)
    assert result.exit_code == 2, result.output
    assert message in " ".join(result.output.split())
