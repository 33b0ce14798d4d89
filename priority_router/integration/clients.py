"""Whose document a message is when its client id header is missing: the task's client id
keyword, else the user's ``client_id_getter``.  Publishers and the worker's gate ask the
same way, so a message a non-router publisher sent (the id only in its keyword arguments,
or an id too long for a header) is the same client's on both sides."""

from __future__ import annotations

import logging
from typing import Any

from ..config import ClientIdGetter
from ..store.client_ids import normalize_client_id

logger = logging.getLogger("priority_router")


def client_from_call(
    kwarg: str,
    getter: ClientIdGetter | None,
    task_name: str,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    headers: dict[str, Any],
) -> str | None:
    """The client id in ``kwargs[kwarg]``, else ``getter``'s answer; None for neither."""
    client = normalize_client_id(kwargs.get(kwarg))
    if client is not None or getter is None:
        return client
    try:
        return normalize_client_id(getter(task_name, args, kwargs, headers))
    except Exception:
        # The user's function: its failure must not break a publish or a worker.
        logger.exception("client_id_getter failed for %s; treating it as having no client", task_name)
        return None
