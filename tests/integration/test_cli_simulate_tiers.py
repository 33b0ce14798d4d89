"""``priority-router simulate --tier / --default-tier / --tiers`` as a user runs it."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner, Result

from priority_router.ops.cli import main

# One slot: heavy's 4 documents at 0, light's at 0.5 (test_cli_simulate.py's trace).
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
