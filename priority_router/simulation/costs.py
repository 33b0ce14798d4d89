"""What each document counts for in the simulator: its cost, and the priority a count gets.

The units, limits and rounding are the router's (``store/costs.py``): costs are counted in
whole thousandths, so the simulator's counts are the router's exactly.  A document is
checked at the count before it and then lowers its client's count by its cost (1 by
default: costs of 1 are the scheme as it always was).  A fractional count is truncated
toward 0 before the threshold table, after a tier's weight divides it, as the router
decides (``PriorityRouter._decision``, ``Tier.priority``).
"""

from __future__ import annotations

from ..store.costs import MAX_COST, ONE, RESOLUTION, InvalidCost, as_count, cost_units
from ..thresholds import Policy
from ..tiers import Tier

__all__ = [
    "MAX_COST",
    "MAX_UNITS",
    "ONE",
    "RESOLUTION",
    "InvalidCost",
    "as_count",
    "cost_units",
    "level",
    "whole",
]

#: The largest cost of one document, in units.
MAX_UNITS = MAX_COST * RESOLUTION


def whole(units: int) -> int:
    """A count in units (0 or less) truncated toward 0 to whole costs, -2500 -> -2:
    ``int(as_count(units))`` without the float."""
    return -(-units // RESOLUTION)


def level(tier: Tier | None, pending: float, policy: Policy) -> int:
    """The router's priority for a count that may be fractional, with ``tier`` (None: the
    table alone)."""
    return policy.priority_for(int(pending)) if tier is None else tier.priority(pending, policy)
