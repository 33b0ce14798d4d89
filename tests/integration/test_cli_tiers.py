"""``priority-router tier`` and ``inspect``'s tier against a real Redis, as an operator runs them."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import redis
from click.testing import CliRunner, Result

from priority_router import PriorityRouter
from priority_router.limits import Limits
from priority_router.ops.cli import main
from priority_router.router import engine_of
from priority_router.store.client_ids import client_token, tier_key
from priority_router.tiers import Tier

#: The columns of one ``tier list --json`` row.
ROW_KEYS = {"client_id", "tier", "weight", "shift", "fixed", "error"} | {
    "max_in_flight",
    "max_cost_in_flight",
    "borrow",
    "rate",
    "burst",
}


@pytest.fixture
def router(counter_url: str, key_prefix: str) -> PriorityRouter:
    """A publisher on the same store; it reads the default tier and the in-use marker at
    every check instead of every 5 s, so what the CLI sets applies at once."""
    publisher = PriorityRouter(redis_url=counter_url, key_prefix=key_prefix)
    engine_of(publisher).tier_store.refresh = 0.0
    return publisher


NO_LIMITS = {"max_in_flight": None, "max_cost_in_flight": None, "borrow": False, "rate": None, "burst": None}


def listed(cli: Callable[..., Result]) -> dict[str, Any]:
    result = cli("tier", "list", "--json")
    assert result.exit_code == 0, result.output
    data: dict[str, Any] = json.loads(result.output)
    return data


def test_set_prints_what_is_in_effect_and_stores_it(
    cli: Callable[..., Result], router: PriorityRouter
) -> None:
    done = cli("tier", "set", "acme", "--weight", "2", "--shift", "-1")
    assert done.exit_code == 0, done.output
    lines = done.output.splitlines()
    assert lines[0] == "acme: weight=2 shift=-1 (was: none)"
    assert "Publishers with tiers=False ignore tiers." in lines[1]
    assert router.tier("acme") == Tier(weight=2, shift=-1)

    # A new tier replaces the whole tier, and says what it replaced.
    again = cli("tier", "set", "acme", "--fixed=1")
    assert again.output.splitlines()[0] == "acme: fixed=1 (was: weight=2 shift=-1)"
    assert router.tier("acme") == Tier(fixed=1)


def test_list_sorts_every_client_and_shows_the_default(
    cli: Callable[..., Result], router: PriorityRouter
) -> None:
    assert listed(cli) == {"clients": [], "default": None}
    for args in (["zeta", "--shift", "2"], ["acme", "--weight", "0.5"], ["mid", "--neutral"]):
        assert cli("tier", "set", *args).exit_code == 0
    assert cli("tier", "set", "--default", "--fixed", "9").exit_code == 0
    router.record("acme")  # counts are no tiers: they are not listed

    data = listed(cli)
    clients = data["clients"]
    assert all(set(row) == ROW_KEYS for row in clients)
    assert [(r["client_id"], r["tier"]) for r in clients] == [
        ("acme", "weight=0.5"),
        ("mid", "neutral"),
        ("zeta", "shift=2"),
    ]
    assert clients[0] == {
        "client_id": "acme",
        "tier": "weight=0.5",
        "weight": 0.5,
        "shift": 0,
        "fixed": None,
        **NO_LIMITS,
        "error": None,
    }
    assert data["default"] == {
        "tier": "fixed=9",
        "weight": 1.0,
        "shift": 0,
        "fixed": 9,
        **NO_LIMITS,
        "error": None,
    }

    table = cli("tier", "list")
    assert table.exit_code == 0, table.output
    out = table.output
    assert out.index("acme") < out.index("mid") < out.index("zeta")
    assert "3 client(s) with a tier of their own" in out
    assert "Default tier, for every other client: fixed=9" in out


def test_unset_removes_a_tier_and_says_what_applies_now(
    cli: Callable[..., Result], router: PriorityRouter
) -> None:
    router.set_tier("acme", shift=1)
    router.set_default_tier(shift=2)
    done = cli("tier", "unset", "acme")
    assert done.exit_code == 0, done.output
    assert done.output.strip() == "acme: tier removed; the default tier applies (shift=2)"
    assert router.tier("acme") is None
    assert cli("tier", "unset", "acme").output.strip() == "acme had no tier of its own; nothing removed"

    default = cli("tier", "unset", "--default")
    assert default.exit_code == 0
    assert default.output.startswith("default tier removed")
    assert router.default_tier() is None
    assert cli("tier", "unset", "--default").output.strip() == "no default tier was set; nothing removed"
    router.set_tier("acme", fixed=2)
    assert cli("tier", "unset", "acme").output.strip() == "acme: tier removed; the threshold table applies"
    assert listed(cli) == {"clients": [], "default": None}


def test_default_tier_and_a_neutral_tier_that_exempts_a_client(
    cli: Callable[..., Result], router: PriorityRouter
) -> None:
    done = cli("tier", "set", "--default", "--shift", "1")
    assert done.exit_code == 0, done.output
    assert done.output.startswith("default: shift=1 (was: none)")
    assert "publishers read it again within 5 s" in done.output
    assert router.default_tier() == Tier(shift=1)
    assert cli("tier", "set", "internal", "--neutral").exit_code == 0
    assert router.tier("internal") == Tier()

    fresh = PriorityRouter(redis_url=router.config.redis_url, key_prefix=router.config.key_prefix)
    anyone, internal = fresh.record("anyone"), fresh.record("internal")
    assert (anyone.priority, anyone.tier) == (2, "default: shift=1")
    assert (internal.priority, internal.tier) == (1, "client: neutral")


def test_a_tier_set_with_the_cli_changes_what_record_decides(
    cli: Callable[..., Result], router: PriorityRouter
) -> None:
    before = router.record("acme")
    assert (before.priority, before.tier) == (1, None)

    assert cli("tier", "set", "acme", "--fixed", "9").exit_code == 0
    after = router.record("acme")  # the same router: a client's tier is read in its own check
    assert (after.pending, after.priority, after.tier) == (-1, 9, "client: fixed=9")

    assert cli("tier", "set", "acme", "--weight", "4").exit_code == 0
    assert [router.record("acme").priority for _ in range(8)] == [1] * 8  # pending -2..-9: /4 -> 0..-2
    assert cli("tier", "unset", "acme").exit_code == 0
    assert router.record("acme").priority == 5  # pending -10: the table alone


def test_inspect_shows_the_clients_tier_and_keeps_its_other_keys(
    cli: Callable[..., Result], router: PriorityRouter
) -> None:
    for _ in range(22):
        router.record("bulk")
    plain = json.loads(cli("inspect", "bulk", "--json").output)
    assert plain["tier"] is None
    old_keys = ["client_id", "pending", "priority", "seconds_since_update", "seconds_until_reset"]
    assert list(plain) == [*old_keys, "tracked", "key", "tier", "table_priority", "counted", "thresholds"]
    assert plain["priority"] == plain["table_priority"] == 9

    cli("tier", "set", "bulk", "--shift=-2")
    own = json.loads(cli("inspect", "bulk", "--json").output)
    assert own["tier"] == "client: shift=-2"
    unchanged = ["client_id", "pending", "tracked", "key", "table_priority"]
    assert [own[k] for k in unchanged] == [plain[k] for k in unchanged]
    assert (own["pending"], own["priority"]) == (-21, 7), "the priority its next document gets"
    assert own["priority"] == router.peek("bulk").priority
    table = cli("inspect", "bulk")
    assert table.exit_code == 0, table.output
    assert "client: shift=-2" in table.output and "table_priority" in table.output

    cli("tier", "set", "--default", "--fixed", "3")
    assert json.loads(cli("inspect", "nobody", "--json").output)["tier"] == "default: fixed=3"
    assert json.loads(cli("inspect", "bulk", "--json").output)["tier"] == "client: shift=-2"
    cli("tier", "unset", "bulk")
    assert json.loads(cli("inspect", "bulk", "--json").output)["tier"] == "default: fixed=3"


def test_an_unreadable_tier_is_listed_as_invalid_with_the_fix(
    cli: Callable[..., Result], router: PriorityRouter, key_prefix: str
) -> None:
    router.set_tier("fine", shift=1)
    engine_of(router).redis.set(tier_key(key_prefix, "broken"), "w=heavy")
    rows = listed(cli)["clients"]
    broken = rows[0]
    assert broken["client_id"] == "broken" and broken["tier"] is None
    assert "'w=heavy' is not a tier" in broken["error"] and "priority-router tier set" in broken["error"]
    assert rows[1]["tier"] == "shift=1"
    table = cli("tier", "list")
    assert table.exit_code == 0, table.output
    assert "invalid" in table.output and "2 client(s) with a tier of their own, 1 invalid" in table.output

    inspected = json.loads(cli("inspect", "broken", "--json").output)
    assert inspected["tier"].startswith("client: invalid (stored value 'w=heavy' is not a tier")

    engine_of(router).redis.set(key_prefix + "tier-default", "s=x")
    assert "is not a tier" in str(listed(cli)["default"])
    again = cli("tier", "set", "broken", "--fixed", "4")
    assert again.output.startswith("broken: fixed=4 (was: unreadable)")


def test_long_ids_are_listed_as_the_hash_the_other_commands_show(
    cli: Callable[..., Result], router: PriorityRouter
) -> None:
    long_id = "tenant/" + "x" * 100
    assert cli("tier", "set", long_id, "--fixed", "2").exit_code == 0
    (row,) = listed(cli)["clients"]
    assert row["client_id"] == client_token(long_id) and row["client_id"].startswith("#")
    router.record(long_id)
    status = json.loads(cli("status", "--json").output)
    assert [r["client_id"] for r in status] == [row["client_id"]]
    assert router.record(long_id).priority == 2


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("acme", "--weight", "0"), "tier weight: 0.0 is not above 0"),
        (("acme", "--weight", "-2"), "tier weight"),
        (("acme", "--weight", "nan"), "tier weight"),
        (("acme", "--weight", "inf"), "tier weight"),
        (("acme", "--weight", "5000"), "at most 1000"),
        (("acme", "--shift", "9"), "tier shift"),
        (("acme", "--fixed", "0"), "tier fixed"),
        (("acme", "--fixed", "10"), "tier fixed"),
        (("acme", "--fixed", "1", "--weight", "2"), "give either fixed, or weight and/or shift"),
        (("acme", "--fixed", "9", "--shift", "-1"), "give either fixed"),
        (("--default", "--fixed", "12"), "tier fixed"),
        (("acme", "--weight", "heavy"), "'heavy' is not a valid float"),
        (("acme", "--shift", "1.5"), "'1.5' is not a valid integer"),
        (("acme",), "give --weight, --shift, --fixed and/or a limit"),
        (("acme", "--neutral", "--fixed", "2"), "--neutral stores a tier that changes nothing"),
        (("--default", "--neutral"), "a neutral default tier changes nothing"),
        (("acme", "--default", "--fixed", "2"), "name one CLIENT, or pass --default"),
        (("--fixed", "2"), "name one CLIENT, or pass --default"),
        (("  ", "--fixed", "2"), "is not a client id"),
    ],
)
def test_bad_values_exit_2_with_the_fix_and_store_nothing(
    cli: Callable[..., Result], args: tuple[str, ...], message: str
) -> None:
    result = cli("tier", "set", *args)
    assert result.exit_code == 2, result.output
    assert message in " ".join(result.output.split())
    if message.startswith("tier") or "give either" in message:  # a ConfigurationError: its text
        assert "Fix:" in result.output
    assert listed(cli) == {"clients": [], "default": None}


def test_unset_needs_exactly_one_target(cli: Callable[..., Result]) -> None:
    for args in ((), ("acme", "--default")):
        result = cli("tier", "unset", *args)
        assert result.exit_code == 2
        assert "name one CLIENT, or pass --default" in result.output


def test_the_app_option_uses_the_installed_routers_store(
    counter_url: str, key_prefix: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    app_prefix = key_prefix + "app:"
    (tmp_path / "tier_cli_app.py").write_text(
        "from celery import Celery\n"
        "from priority_router import PriorityRouter\n"
        "app = Celery('tier-app', broker='memory://', set_as_current=False)\n"
        f"PriorityRouter(redis_url={counter_url!r}, key_prefix={app_prefix!r}).install(app)\n"
        "quiet = Celery('tier-quiet', broker='memory://', set_as_current=False)\n"
        f"PriorityRouter(redis_url={counter_url!r}, key_prefix={app_prefix!r}, tiers=False).install(quiet)\n"
    )
    monkeypatch.chdir(tmp_path)
    runner = CliRunner()
    done = runner.invoke(main, ["tier", "set", "acme", "--shift", "1", "-A", "tier_cli_app"])
    assert done.exit_code == 0, done.output
    assert "tiers=False: its publishers ignore" not in done.output
    assert PriorityRouter(redis_url=counter_url, key_prefix=app_prefix).tier("acme") == Tier(shift=1)
    assert PriorityRouter(redis_url=counter_url, key_prefix=key_prefix).tier("acme") is None

    for args in (
        ["-A", "tier_cli_app", "tier", "list", "--json"],
        ["tier", "list", "-A", "tier_cli_app", "--json"],
    ):
        result = runner.invoke(main, args)
        assert result.exit_code == 0, (args, result.output)
        assert [r["client_id"] for r in json.loads(result.output)["clients"]] == ["acme"]
    inspected = runner.invoke(main, ["-A", "tier_cli_app", "inspect", "acme", "--json"])
    assert json.loads(inspected.output)["tier"] == "client: shift=1"

    quiet = runner.invoke(main, ["tier", "list", "-A", "tier_cli_app:quiet"])
    assert quiet.exit_code == 0, quiet.output
    assert "This router has tiers=False: its publishers ignore every tier." in quiet.output
    unset = runner.invoke(main, ["-A", "tier_cli_app", "tier", "unset", "acme"])
    assert unset.exit_code == 0 and "tier removed" in unset.output


def test_store_options_after_the_subcommand_win(
    counter_url: str, key_prefix: str, router: PriorityRouter, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PRIORITY_ROUTER_REDIS_URL", "redis://127.0.0.1:1/0")
    runner = CliRunner()
    done = runner.invoke(
        main, ["tier", "set", "acme", "--fixed", "5", "--redis-url", counter_url, "--key-prefix", key_prefix]
    )
    assert done.exit_code == 0, done.output
    assert router.tier("acme") == Tier(fixed=5)


def test_an_unreachable_store_exits_1_without_the_password() -> None:
    url = "redis://:hunter2@127.0.0.1:1/0"
    for args in (["tier", "list"], ["tier", "set", "acme", "--fixed", "2"], ["tier", "unset", "--default"]):
        result = CliRunner().invoke(main, ["--redis-url", url, *args])
        assert result.exit_code == 1, (args, result.output)
        assert "hunter2" not in result.output


def test_the_installed_program_sets_and_lists(
    counter_url: str, key_prefix: str, real_redis: redis.Redis
) -> None:
    env = {**os.environ, "PRIORITY_ROUTER_REDIS_URL": counter_url, "PRIORITY_ROUTER_KEY_PREFIX": key_prefix}

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "priority_router", *args],
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
        )

    done = run("tier", "set", "paid", "--shift", "-1")
    assert done.returncode == 0, done.stderr
    assert real_redis.get(tier_key(key_prefix, "paid")) == b"s=-1"
    listing = run("tier", "list", "--json")
    assert json.loads(listing.stdout)["clients"][0]["tier"] == "shift=-1"
    refused = run("tier", "set", "paid", "--weight", "0")
    assert refused.returncode == 2 and "tier weight" in refused.stderr


def test_set_gives_a_client_limits_with_its_tier_and_list_shows_them(
    cli: Callable[..., Result], counter_url: str, key_prefix: str
) -> None:
    result = cli(
        "tier", "set", "bulk", "--weight", "2", "--max-in-flight", "3", "--borrow", "--rate", "100/m"
    )
    assert result.exit_code == 0, result.output
    assert "bulk: weight=2 max_in_flight=3 borrow rate=100/m" in result.output
    assert "Workers apply the limits within 1 s" in result.output
    assert "next publish" in result.output  # it has a weight too
    capped = cli("tier", "set", "capped", "--max-in-flight", "1")
    assert "next publish" not in capped.output  # publishers never read limits
    assert "Its priority follows the table alone" in capped.output
    assert cli("tier", "unset", "capped").exit_code == 0
    router = PriorityRouter(counter_url, key_prefix=key_prefix)
    assert router.limits("bulk") == Limits(max_in_flight=3, borrow=True, rate="100/m")
    (row,) = listed(cli)["clients"]
    assert (row["max_in_flight"], row["borrow"], row["rate"], row["weight"]) == (3, True, "100/m", 2.0)

    assert cli("tier", "set", "--default", "--max-in-flight", "10").exit_code == 0
    assert router.limits("someone-else") == Limits(max_in_flight=10)
    assert router.limits("bulk").max_in_flight == 3  # its own tier replaces the default
    # Setting a tier again without the cap lifts it.
    assert cli("tier", "set", "bulk", "--weight", "2").exit_code == 0
    assert router.limits("bulk") == Limits()
    assert cli("tier", "unset", "bulk").exit_code == 0
    assert router.limits("bulk") == Limits(max_in_flight=10)


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["--max-in-flight", "0"], "max_in_flight: 0 is not a whole number of documents from 1"),
        (["--borrow"], "borrow=True lets a capped client run beyond its cap"),
        (["--rate", "5 per second"], "is not R/s, R/m or R/h"),
        (["--burst", "4"], "no rate is given"),
        (["--max-cost-in-flight", "-1"], "is not above 0"),
    ],
)
def test_bad_limits_are_refused_before_anything_is_stored(
    cli: Callable[..., Result], counter_url: str, key_prefix: str, args: list[str], says: str
) -> None:
    result = cli("tier", "set", "bulk", *args)
    assert result.exit_code == 2
    assert says in result.output
    assert PriorityRouter(counter_url, key_prefix=key_prefix).tier("bulk") is None


def test_unset_default_removes_default_limits_alone(
    cli: Callable[..., Result], counter_url: str, key_prefix: str
) -> None:
    assert cli("tier", "set", "--default", "--max-in-flight", "5").exit_code == 0
    result = cli("tier", "unset", "--default")
    assert "default tier removed" in result.output
    assert PriorityRouter(counter_url, key_prefix=key_prefix).limits("anyone") == Limits()


def test_unset_says_how_many_documents_the_lifted_cap_held(
    cli: Callable[..., Result], counter_url: str, key_prefix: str
) -> None:
    """Held documents start only when a router worker releases them: unset says so."""
    assert cli("tier", "set", "bulk", "--max-in-flight", "1").exit_code == 0
    router = PriorityRouter(counter_url, key_prefix=key_prefix)
    limits = router.limits("bulk")
    assert engine_of(router).gate_store.admit("bulk", "first", limits, 1000).outcome == "run"
    for task in ("second", "third"):
        held = engine_of(router).gate_store.admit("bulk", task, limits, 1000)
        engine_of(router).gate_store.note_held("bulk", held)
    result = cli("tier", "unset", "bulk")
    assert result.exit_code == 0, result.output
    assert "2 document(s) held by caps wait in their holding queue" in result.output
    assert "held by caps" not in cli("tier", "unset", "light").output


def test_unset_that_removed_the_tier_exits_0_when_held_documents_cannot_be_counted(
    counter_url: str, key_prefix: str
) -> None:
    """The held count after an unset is a note: a user that can change tiers but not read the
    gate (here an ACL user without sorted sets) saw exit 1, "could not read the gate", though
    the tier was gone."""
    admin = redis.Redis.from_url(counter_url)
    user = f"tiers-{os.getpid()}"
    admin.acl_setuser(
        user, enabled=True, passwords=["+pw"], keys=[f"{key_prefix}*"], commands=["+@all", "-@sortedset"]
    )
    try:
        limited = counter_url.replace("redis://", f"redis://{user}:pw@", 1)
        runner = CliRunner()
        base = ["--redis-url", limited, "--key-prefix", key_prefix]
        assert runner.invoke(main, [*base, "tier", "set", "bulk", "--max-in-flight", "1"]).exit_code == 0
        result = runner.invoke(main, [*base, "tier", "unset", "bulk"])
        assert result.exit_code == 0, result.output
        assert "bulk: tier removed" in result.stdout
        assert "could not count the documents its limits held" in result.stderr
        assert "no permissions to run the 'zcount' command" in result.stderr
        assert "pw@" not in result.output
        assert PriorityRouter(counter_url, key_prefix=key_prefix).tier("bulk") is None
    finally:
        admin.acl_deluser(user)
