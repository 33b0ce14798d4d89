"""``priority-router simulate TRACE --tune``: a table fitted to a small trace, the lines to
paste, its JSON, when there is nothing to fit, and the options it refuses."""

from __future__ import annotations

import functools
import json
import random
import re
from pathlib import Path

import pytest
from click.testing import CliRunner, Result

from priority_router import PriorityRouter, RouterConfig
from priority_router.config import celery_values
from priority_router.ops.cli import main
from priority_router.ops.simulate import simulate
from priority_router.simulation.fit import recommend
from priority_router.simulation.tune import Case, candidates
from priority_router.thresholds import DEFAULT_THRESHOLDS, WIDE_THRESHOLDS, Policy, parse_table


def write_trace(path: Path, medium: int = 30) -> Path:
    """A giant of 300 documents at 0, a medium client of ``medium`` at 2 s (none with 0),
    8 light clients of 2 each over the first minute; documents of 1-2 s."""
    rng = random.Random(5)
    rows = [(0.0, "giant", rng.uniform(1, 2)) for _ in range(300)]
    rows += [(2.0, "medium", rng.uniform(1, 2)) for _ in range(medium)]
    rows += [(rng.uniform(0, 60), f"light{c}", rng.uniform(1, 2)) for c in range(8) for _ in range(2)]
    lines = [f"{t:.3f},{client},{seconds:.3f}" for t, client, seconds in sorted(rows)]
    path.write_text("timestamp,client_id,duration\n" + "\n".join(lines) + "\n")
    return path


@pytest.fixture
def trace(tmp_path: Path) -> Path:
    return write_trace(tmp_path / "trace.csv")


def invoke(*args: str, env: dict[str, str | None] | None = None) -> Result:
    clean: dict[str, str | None] = {
        "PRIORITY_ROUTER_MAX_WAIT": None,
        "PRIORITY_ROUTER_MODE": None,
        "PRIORITY_ROUTER_THRESHOLDS": None,
        "PRIORITY_ROUTER_TIERS": None,
    }
    return CliRunner().invoke(simulate, list(args), env={**clean, **(env or {})})


def tuned_json(*args: str, env: dict[str, str | None] | None = None) -> dict[str, object]:
    result = invoke(*args, "--tune", "--json", env=env)
    assert result.exit_code == 0, result.output
    found: dict[str, object] = json.loads(result.stdout)
    return found


def test_the_paste_lines_give_the_tuned_table_to_every_settings_source(trace: Path) -> None:
    result = invoke(str(trace), "--tune")
    assert result.exit_code == 0, result.output
    out = result.output
    assert "Recommended: tuned table" in out
    rows = re.search(r"^  --thresholds (\S+)$", out, re.M)
    assert rows is not None, out
    text = rows.group(1)
    table = parse_table(text)
    assert table not in (DEFAULT_THRESHOLDS, WIDE_THRESHOLDS)
    assert f"The tuned table: {text}" in out
    # Each line, read the way its settings source reads it, gives that table.
    assert f"\n  PRIORITY_ROUTER_THRESHOLDS={text}\n" in out
    assert RouterConfig.from_env({"PRIORITY_ROUTER_THRESHOLDS": text}).thresholds == table
    celery_line = re.search(r"^  (priority_router_thresholds = .*)$", out, re.M)
    assert celery_line is not None
    conf: dict[str, object] = {}
    exec(celery_line.group(1), {}, conf)
    assert celery_values(conf) == {"thresholds": table}
    python_line = re.search(r"^  (PriorityRouter\(.*\))$", out, re.M)
    assert python_line is not None
    router = functools.partial(PriorityRouter, redis_url="redis://127.0.0.1:1/0")
    assert eval(python_line.group(1), {"PriorityRouter": router}).policy == table
    replay = invoke(str(trace), "--policies", "seed", "--thresholds", text)
    assert replay.exit_code == 0, replay.output


def test_the_tuned_table_serves_the_medium_client_as_drr_would(trace: Path) -> None:
    found = tuned_json(str(trace))
    policies = found["policies"]
    assert isinstance(policies, dict)
    assert list(policies) == ["fifo", "default", "wide", "tuned", "drr"]
    medium = {name: p["groups"]["medium"]["worst_p95"] for name, p in policies.items()}
    assert medium["default"] > 5 * medium["drr"]  # behind the giant's 300 documents
    assert medium["tuned"] <= max(1.1 * medium["drr"], medium["drr"] + 2)
    assert policies["tuned"]["score"] <= 1.0 < policies["default"]["score"]


def test_json_holds_what_the_tables_show(trace: Path) -> None:
    found = tuned_json(str(trace), "--workers", "4")
    assert (found["documents"], found["clients"], found["workers"]) == (346, 10, 4)
    assert (found["policy"], found["searched"]) == ("seed", len(candidates()))
    assert "worst of three ratios" in str(found["objective"])
    policies = found["policies"]
    assert isinstance(policies, dict)
    for name in ("fifo", "drr"):
        assert (policies[name]["thresholds"], policies[name]["score"]) == (None, None)
    assert policies["default"]["thresholds"] == "default"
    assert policies["wide"]["thresholds"] == "wide"
    assert {g: v["clients"] for g, v in policies["tuned"]["groups"].items()} == {
        "light": 8,
        "medium": 1,
        "heavy": 1,
    }
    recommended = found["recommended"]
    assert isinstance(recommended, dict)
    assert recommended["policy"] == "tuned"
    assert recommended["thresholds"] == policies["tuned"]["thresholds"]
    assert recommended["settings"] == {
        "option": f"--thresholds {recommended['thresholds']}",
        "environment": f"PRIORITY_ROUTER_THRESHOLDS={recommended['thresholds']}",
        "celery": f'priority_router_thresholds = "{recommended["thresholds"]}"',
        "python": f'PriorityRouter(thresholds="{recommended["thresholds"]}")',
    }
    text = invoke(str(trace), "--workers", "4", "--tune").output
    assert f"--thresholds {recommended['thresholds']}" in text
    assert f"{policies['tuned']['score']:.2f}" in text


def test_without_medium_clients_it_keeps_the_default_table_and_says_why(tmp_path: Path) -> None:
    trace = write_trace(tmp_path / "trace.csv", medium=0)
    result = invoke(str(trace), "--tune")
    assert result.exit_code == 0, result.output
    out = " ".join(result.output.split())
    assert "no medium clients (more than 20 documents and at most 10% of the largest client's 300)" in out
    assert "and one heavy client: nothing for a deeper table to separate" in out
    assert "Recommended: default table" in out and "keep the default table" in out
    assert "Searched" not in out and "tuned" not in out
    found = tuned_json(str(trace))
    assert found["searched"] == 0
    assert list(found["policies"]) == ["fifo", "default", "wide", "drr"]  # type: ignore[arg-type]
    assert found["recommended"]["policy"] == "default"  # type: ignore[index]


def test_one_client_has_nothing_to_separate(tmp_path: Path) -> None:
    trace = tmp_path / "one.csv"
    trace.write_text("timestamp,client_id,duration\n" + "".join(f"{i},acme,2\n" for i in range(30)))
    result = invoke(str(trace), "--tune")
    assert result.exit_code == 0, result.output
    assert "the trace has one client" in " ".join(result.output.split())
    assert "  --thresholds default\n" in result.output


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--tune", "--policies", "seed"], "--tune compares its own policies"),
        (["--tune", "--plot", "waits.png"], "so it takes no --plot"),
        (["--tune", "--clients", "5"], "so it takes no --clients"),
        (["--mode", "inflight"], "--mode is the counting mode --tune fits a table to"),
        (["--tune", "--mode", "both"], "'both' is not one of 'seed', 'inflight'"),
    ],
)
def test_options_tune_cannot_take_are_refused(trace: Path, args: list[str], message: str) -> None:
    result = invoke(str(trace), *args)
    assert result.exit_code == 2, result.output
    assert message in " ".join(result.output.split())


@pytest.mark.parametrize(
    ("args", "env", "expected"),
    [
        ([], {}, {"mode": "seed", "policy": "seed", "workers": 4, "reset_interval": 1500.0}),
        (["--mode", "inflight"], {}, {"policy": "inflight"}),
        ([], {"PRIORITY_ROUTER_MODE": "inflight"}, {"policy": "inflight"}),
        (["--mode", "seed"], {"PRIORITY_ROUTER_MODE": "inflight"}, {"policy": "seed"}),
        (["--max-wait", "30"], {}, {"policy": "seed+max_wait", "max_wait": 30.0}),
        (["--reset-interval", "90", "--workers", "8"], {}, {"reset_interval": 90.0, "workers": 8}),
        (["--quantum", "2", "--overhead", "0.01"], {}, {"quantum": 2.0, "overhead": 0.01}),
        (["--gate-tick", "0.5"], {}, {"gate_tick": 0.5}),
    ],
)  # fmt: skip
def test_the_settings_reach_what_is_tuned(
    trace: Path,
    monkeypatch: pytest.MonkeyPatch,
    args: list[str],
    env: dict[str, str],
    expected: dict[str, object],
) -> None:
    seen: list[Case] = []
    monkeypatch.setattr(
        "priority_router.ops.simulate.run_tune", lambda console, case, *rest: seen.append(case)
    )
    result = invoke(str(trace), "--tune", *args, env={**env})
    assert result.exit_code == 0, result.output
    (case,) = seen
    assert {key: getattr(case, key) for key in expected} == expected


def test_the_groups_mode_reaches_what_is_tuned(trace: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[Case] = []
    monkeypatch.setattr(
        "priority_router.ops.simulate.run_tune", lambda console, case, *rest: seen.append(case)
    )
    runner = CliRunner(env={"PRIORITY_ROUTER_MODE": None})
    result = runner.invoke(
        main, ["--mode", "inflight", "--reset-interval", "60", "simulate", str(trace), "--tune"]
    )
    assert result.exit_code == 0, result.output
    assert (seen[0].policy, seen[0].reset_interval) == ("inflight", 60.0)
    # Its own --mode wins, as an option after the subcommand does.
    result = runner.invoke(main, ["--mode", "inflight", "simulate", str(trace), "--tune", "--mode", "seed"])
    assert result.exit_code == 0, result.output
    assert seen[1].policy == "seed"


def test_costs_and_tiers_reach_what_is_tuned(trace: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[tuple[Case, Policy]] = []
    monkeypatch.setattr(
        "priority_router.ops.simulate.run_tune",
        lambda console, case, current, *rest: seen.append((case, current)),
    )
    result = invoke(
        str(trace), "--tune", "--cost", "duration", "--tier", "giant=weight=2", "--thresholds", "wide"
    )
    assert result.exit_code == 0, result.output
    ((case, current),) = seen
    assert case.trace.cost_units  # each document counted by its seconds
    assert case.tiers is not None and case.tiers.tier_of("giant") is not None
    assert current is WIDE_THRESHOLDS


def test_your_table_is_shown_beside_the_others(trace: Path) -> None:
    policies = tuned_json(str(trace), "--thresholds", "-300:9,-3:2")["policies"]
    assert isinstance(policies, dict)
    assert list(policies) == ["fifo", "default", "wide", "yours", "tuned", "drr"]
    assert policies["yours"]["thresholds"] == "-300:9,-3:2"


def test_tiers_change_what_is_tuned(trace: Path) -> None:
    # The medium client pinned behind everyone: no table can bring it forward.
    found = tuned_json(str(trace), "--tier", "medium=fixed=9")
    policies = found["policies"]
    assert isinstance(policies, dict)
    assert (
        policies["tuned"]["groups"]["medium"]["worst_p95"]
        > 5 * policies["drr"]["groups"]["medium"]["worst_p95"]
    )


@pytest.mark.parametrize(
    ("scores", "chosen"),
    [
        ({"default": 2.0, "wide": 1.0, "tuned": 0.5}, "tuned"),
        ({"default": 2.0, "wide": 0.52, "tuned": 0.5}, "wide"),
        ({"default": 0.51, "wide": 0.6, "tuned": 0.5}, "default"),
        ({"default": 2.0, "wide": 0.6, "yours": 0.52, "tuned": 0.5}, "yours"),
        ({"default": 0.0, "wide": 0.0, "tuned": 0.0}, "default"),
        ({"default": 2.0, "wide": 1.02, "tuned": 0.99}, "tuned"),  # wide would miss a bound
        ({"default": 2.0, "wide": 1.12, "tuned": 1.1}, "wide"),
    ],
)
def test_the_simplest_table_within_5_percent_of_the_best_is_recommended(
    scores: dict[str, float], chosen: str
) -> None:
    assert recommend(scores) == chosen
