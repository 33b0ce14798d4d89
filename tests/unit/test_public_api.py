"""The public API (CHANGELOG's version policy): what ``priority_router`` exports and the
router's documented methods.  A change here is a change users see: say it in the CHANGELOG."""

from __future__ import annotations

import inspect

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
