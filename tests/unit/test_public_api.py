"""The public API (CHANGELOG's version policy): what ``priority_router`` exports and the
router's documented methods.  A change here is a change users see: say it in the CHANGELOG."""

from __future__ import annotations

import inspect

import fakeredis

import priority_router
from priority_router import PriorityRouter

EXPORTED = {
    "ConfigurationError",
    "CounterUnavailable",
    "DEFAULT_THRESHOLDS",
    "Decision",
    "Limits",
    "Policy",
    "PriorityRouter",
    "PriorityRouterError",
    "Reason",
    "RouterConfig",
    "Threshold",
    "Tier",
    "Transport",
    "__version__",
    "from_wire",
    "to_wire",
}
#: What set_tier and set_default_tier take: a tier's priority part and its limits.
TIER_KEYWORDS = ["weight", "shift", "fixed", "max_in_flight", "borrow", "rate", "burst", "max_cost_in_flight"]
#: The methods the README and docs show, with the keywords they take.
DOCUMENTED = {
    "install": [],
    "uninstall": [],
    "record": ["cost"],
    "record_many": ["cost"],
    "batch": ["cost"],
    "end": ["cost"],
    "peek": [],
    "reset": [],
    "state": [],
    "set_tier": TIER_KEYWORDS,
    "unset_tier": [],
    "tier": [],
    "tiers": [],
    "set_default_tier": TIER_KEYWORDS,
    "unset_default_tier": [],
    "default_tier": [],
    "limits": [],
    "gate_state": [],
    "from_env": [],
    "from_config": [],
}


def test_the_package_exports_exactly_its_public_names() -> None:
    assert set(priority_router.__all__) == EXPORTED
    for name in EXPORTED:
        assert getattr(priority_router, name) is not None


def test_the_routers_documented_methods_take_their_documented_keywords() -> None:
    for name, keywords in DOCUMENTED.items():
        method = getattr(PriorityRouter, name)
        parameters = inspect.signature(method).parameters
        assert set(keywords) <= set(parameters), (name, keywords)
        for keyword in keywords:
            assert parameters[keyword].kind is inspect.Parameter.KEYWORD_ONLY, (name, keyword)


#: Every public class's public members, instance attributes included: what docs/api.md shows.
#: The router's are what users call (at most 26); the stores and the calls its integration
#: makes live on its engine (``priority_router/engine.py``), which is not public.
MEMBERS = {
    "PriorityRouter": {*DOCUMENTED, "config", "policy", "decide", "decide_many"},
    "RouterConfig": {
        "as_dict",
        "client_id_getter",
        "client_id_header",
        "client_id_kwarg",
        "connect_timeout",
        "consumer_check_interval",
        "cooldown",
        "cost_getter",
        "default_priority",
        "dry_run",
        "flower_kwargsrepr",
        "from_env",
        "from_mapping",
        "key_prefix",
        "lease",
        "max_wait",
        "metrics",
        "metrics_port",
        "mode",
        "redis_url",
        "reset_interval",
        "socket_timeout",
        "tasks",
        "thresholds",
        "tiers",
    },
    "Decision": {"client_id", "cost", "pending", "priority", "reason", "tier"},
    "Limits": {
        "as_dict",
        "borrow",
        "bucket",
        "burst",
        "describe",
        "encode",
        "max_cost_in_flight",
        "max_in_flight",
        "per_second",
        "rate",
    },
    "Policy": {"fallback", "from_rows", "priority_for"},
    "Threshold": set(),
    "Tier": {
        "applied_as",
        "as_dict",
        "describe",
        "encode",
        "fixed",
        "limits",
        "priority",
        "shift",
        "weight",
        "with_limits",
    },
}


def public(obj: object) -> set[str]:
    return {name for name in dir(obj) if not name.startswith("_")}


def test_each_public_class_has_exactly_its_public_members() -> None:
    for name, members in MEMBERS.items():
        assert public(getattr(priority_router, name)) == members, name
    router = PriorityRouter(redis_client=fakeredis.FakeRedis())
    assert public(router) == MEMBERS["PriorityRouter"], "an instance attribute is public API too"
    assert len(MEMBERS["PriorityRouter"]) <= 26
