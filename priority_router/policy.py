"""Deprecated: the threshold table is :mod:`priority_router.thresholds` now.

Every name still imports from here, each with one DeprecationWarning naming the new module.
"""

from __future__ import annotations

import warnings

from . import thresholds


def __getattr__(name: str) -> object:
    new = thresholds.DEPRECATED.get(name, name)
    if name.startswith("__") or new not in vars(thresholds):
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    renamed = f" ({name} is its old name)" if new != name else ""
    warnings.warn(
        f"priority_router.policy is deprecated: import {new} from priority_router.thresholds{renamed}",
        DeprecationWarning,
        stacklevel=2,
    )
    return vars(thresholds)[new]
