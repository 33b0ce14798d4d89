"""Per-client document priorities for Celery: light clients first, heavy ones later."""

from __future__ import annotations

from .config import RouterConfig
from .decision import Decision, Reason
from .errors import ConfigurationError, CounterUnavailable, PriorityRouterError
from .integration.brokers import Transport, from_wire, to_wire
from .limits import Limits
from .router import PriorityRouter
from .thresholds import DEFAULT_THRESHOLDS, Policy, Threshold, deprecated
from .tiers import Tier

__version__ = "0.2.0.dev0"

__all__ = [
    "DEFAULT_THRESHOLDS",
    "ConfigurationError",
    "CounterUnavailable",
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
]


def __getattr__(name: str) -> object:
    return deprecated(__name__, name)
