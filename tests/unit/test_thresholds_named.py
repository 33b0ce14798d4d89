"""``thresholds="wide"`` by name from every source, how tables are shown, and the last row."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from priority_router import DEFAULT_THRESHOLDS, ConfigurationError, Decision, Policy, RouterConfig
from priority_router.config import celery_values
from priority_router.integration.flower import annotate_kwargsrepr
from priority_router.ops.saturation import describe, saturation
from priority_router.ops.simulate import simulate
from priority_router.thresholds import WIDE_THRESHOLDS, parse_table, rows_text, table_name

WIDE_ROWS = [(-1008, 9), (-612, 8), (-482, 7), (-236, 6), (-148, 5), (-75, 4), (-7, 3), (-2, 2)]


def test_the_default_is_still_the_schemes_table_exactly() -> None:
    assert RouterConfig().thresholds is DEFAULT_THRESHOLDS
    assert [(r.below, r.priority) for r in DEFAULT_THRESHOLDS.thresholds] == [
        (-20, 9), (-14, 8), (-12, 7), (-10, 6), (-8, 5), (-6, 4), (-4, 3), (-2, 2),
    ]  # fmt: skip
    assert DEFAULT_THRESHOLDS.fallback == 1


def test_wide_is_the_measured_table() -> None:
    assert [(r.below, r.priority) for r in WIDE_THRESHOLDS.thresholds] == WIDE_ROWS
    # A client's first three documents are most urgent, as in the scheme's table; 10, 100 and
    # 1,000 documents stay apart.
    got = [WIDE_THRESHOLDS.priority_for(1 - n) for n in (1, 3, 4, 10, 100, 1000, 2000)]
    assert got == [1, 1, 2, 3, 4, 8, 9]


@pytest.mark.parametrize(
    ("text", "table"),
    [("wide", WIDE_THRESHOLDS), (" Wide ", WIDE_THRESHOLDS), ("default", DEFAULT_THRESHOLDS)],
)
def test_a_table_by_name(text: str, table: Policy) -> None:
    assert parse_table(text) is table
    assert RouterConfig(thresholds=text).thresholds is table


def test_a_table_by_rows_as_text() -> None:
    table = parse_table("-100:9,-10:5,fallback:2")
    assert table == Policy.from_rows([(-100, 9), (-10, 5)], fallback=2)
    assert rows_text(table) == "-100:9,-10:5,fallback:2"
    assert parse_table(rows_text(WIDE_THRESHOLDS)) == WIDE_THRESHOLDS


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("widest", "'widest' is neither a table's name nor a LIMIT:PRIORITY row"),
        ("-20:x", "priority 'x' is not a whole number"),
        ("fallback:1,-20:9", "'fallback:1' is not last"),
        ("-10:9,-20:8", "not strictly increasing"),
    ],
)
def test_bad_text_names_the_setting_and_the_fix(text: str, problem: str) -> None:
    with pytest.raises(ConfigurationError) as caught:
        parse_table(text, "PRIORITY_ROUTER_THRESHOLDS")
    assert caught.value.setting == "PRIORITY_ROUTER_THRESHOLDS"
    assert problem in caught.value.problem
    assert caught.value.fix


def test_the_environment_variable() -> None:
    assert RouterConfig.from_env({"PRIORITY_ROUTER_THRESHOLDS": "wide"}).thresholds is WIDE_THRESHOLDS
    with pytest.raises(ConfigurationError, match="PRIORITY_ROUTER_THRESHOLDS: 'wid' is neither"):
        RouterConfig.from_env({"PRIORITY_ROUTER_THRESHOLDS": "wid"})


def test_the_celery_setting() -> None:
    assert celery_values({"priority_router_thresholds": "wide"}) == {"thresholds": WIDE_THRESHOLDS}
    # A Python value is passed as it is, and validated by RouterConfig.
    assert celery_values({"priority_router_thresholds": WIDE_ROWS}) == {"thresholds": WIDE_ROWS}
    with pytest.raises(ConfigurationError, match="priority_router_thresholds: "):
        celery_values({"priority_router_thresholds": "-20:nine"})


def test_the_router_keyword() -> None:
    from priority_router import PriorityRouter

    router = PriorityRouter(redis_url="redis://127.0.0.1:1/0", thresholds="wide")
    assert router.policy is WIDE_THRESHOLDS


def test_how_a_table_is_shown() -> None:
    assert table_name(DEFAULT_THRESHOLDS) == "default"
    assert table_name(Policy.from_rows(WIDE_ROWS)) == "wide"
    assert table_name(Policy.from_rows([(-50, 9), (-5, 3)])) == "-50:9,-5:3"


def test_simulate_takes_the_name() -> None:
    result = CliRunner().invoke(
        simulate,
        ["--workload", "giant-and-medium", "--workers", "8", "--policies", "seed", "--thresholds", "wide"],
    )
    assert result.exit_code == 0, result.output
    assert "thresholds wide" in result.output
    as_json = CliRunner().invoke(
        simulate,
        ["--workload", "giant-and-medium", "--workers", "8", "--policies", "seed", "--json"],
        env={"PRIORITY_ROUTER_THRESHOLDS": "wide"},
    )
    assert as_json.exit_code == 0, as_json.output
    medium_wide = json.loads(as_json.output)["seed"]["per_client"]["medium0"]["p95_wait"]
    default = CliRunner().invoke(
        simulate, ["--workload", "giant-and-medium", "--workers", "8", "--policies", "seed", "--json"]
    )
    medium_default = json.loads(default.output)["seed"]["per_client"]["medium0"]["p95_wait"]
    assert medium_wide < medium_default / 5
    bad = CliRunner().invoke(simulate, ["--workload", "giant-and-medium", "--thresholds", "deep"])
    assert bad.exit_code == 2
    assert "'deep' is neither a table's name" in bad.output


def test_flower_names_a_table_other_than_the_schemes() -> None:
    decision = Decision("acme", -3, 2)
    assert "priority_router_thresholds" not in annotate_kwargsrepr("{}", decision)
    shown = annotate_kwargsrepr("{}", decision, table="wide")
    assert shown.endswith("'priority_router_thresholds': 'wide'}")
    # Not for a document without a count (no client id, or the store failed).
    assert "thresholds" not in annotate_kwargsrepr("{}", Decision(None, None, 5), table="wide")


def test_clients_sharing_the_last_row() -> None:
    assert saturation(DEFAULT_THRESHOLDS, [("bulk", -21), ("light", 0)]) is None  # alone there
    assert saturation(DEFAULT_THRESHOLDS, [("bulk", -20), ("medium", -20)]) is None  # -20 is row 8
    found = saturation(DEFAULT_THRESHOLDS, [("bulk", -999), ("medium", -59), ("light", -1)])
    assert found is not None
    assert (found.clients, found.documents, found.limit, found.priority) == (("bulk", "medium"), 1060, -20, 9)
    problem, fix = describe(found, DEFAULT_THRESHOLDS, "seed")
    assert "2 clients (bulk, medium) share the table's last row (pending < -20, priority 9)" in problem
    assert "1,060 documents counted" in problem
    assert 'thresholds="wide"' in fix and "PRIORITY_ROUTER_THRESHOLDS=wide" in fix
    assert "`priority-router simulate TRACE --tune` fits a table to it" in fix
    _, fix = describe(found, WIDE_THRESHOLDS, "inflight")
    assert (
        "wide table is in use: fit a deeper one to your traffic with `priority-router simulate TRACE --tune`"
        in fix
    )


def test_the_metric_counts_documents_past_the_last_row() -> None:
    from priority_router.metrics import get_metrics

    metrics = get_metrics()
    assert metrics is not None
    before = metrics.last_row._value.get()
    metrics.record_decision(Decision("bulk", -21, 9), last_limit=-20)
    metrics.record_decision(Decision("bulk", -20, 8), last_limit=-20)
    metrics.record_decision(Decision("bulk", -21, 9))  # no table given
    assert metrics.last_row._value.get() == before + 1
