"""The router's settings: one frozen, validated object."""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, fields
from typing import Any

from .errors import ConfigurationError
from .policy import DOCBITS_THRESHOLDS, LEAST_URGENT, MOST_URGENT, Policy

#: Called as ``getter(task_name, args, kwargs, headers)``; returns a client id or None.
ClientIdGetter = Callable[[str, tuple[Any, ...], dict[str, Any], dict[str, Any]], object]

ENV_PREFIX = "PRIORITY_ROUTER_"
#: Shortest idle reset accepted, in seconds.
MIN_RESET_INTERVAL = 1.0


@dataclass(frozen=True)
class RouterConfig:
    """Every setting of a :class:`~priority_router.PriorityRouter`.

    Each field except ``thresholds`` and ``client_id_getter`` can also come from an
    environment variable ``PRIORITY_ROUTER_<FIELD NAME IN CAPITALS>`` through
    :meth:`from_env`.
    """

    redis_url: str = "redis://localhost:6379/0"
    reset_interval: float = 1500.0
    thresholds: Policy = DOCBITS_THRESHOLDS
    default_priority: int = 5
    key_prefix: str = "priority-router:"
    client_id_header: str = "client_id"
    client_id_kwarg: str = "client_id"
    client_id_getter: ClientIdGetter | None = None
    #: Task names or globs whose publishes are counted; None counts every task.
    tasks: tuple[str, ...] | None = None
    #: Seconds the counter may take to connect / to answer before publishing fails open.
    connect_timeout: float = 0.05
    socket_timeout: float = 0.05
    #: Seconds the router stops asking a failed counter store before probing again.
    cooldown: float = 5.0
    #: Append the decision to each message's ``kwargsrepr`` so Flower shows and finds it.
    flower_kwargsrepr: bool = True
    #: Port on which each worker serves Prometheus metrics (needs the ``metrics`` extra).
    metrics_port: int | None = None
    #: Seconds between a publisher's checks that every worker consuming its queues can
    #: see every priority it sends (0 turns the check off).
    consumer_check_interval: float = 60.0

    def __post_init__(self) -> None:
        set_ = object.__setattr__
        set_(self, "redis_url", _check_redis_url(self.redis_url))
        set_(self, "reset_interval", _positive("reset_interval", self.reset_interval))
        if self.reset_interval < MIN_RESET_INTERVAL:
            raise ConfigurationError(
                "reset_interval",
                f"{self.reset_interval!r} s is under {MIN_RESET_INTERVAL:g} s (Redis keeps TTLs in whole "
                "milliseconds and a count that resets within a second measures nothing)",
                "use seconds >= 1; the specified default is 1500",
            )
        interval = self.consumer_check_interval
        if isinstance(interval, bool) or not isinstance(interval, int | float) or not interval >= 0:
            raise ConfigurationError(
                "consumer_check_interval",
                f"{interval!r} is not a number of seconds >= 0",
                "use seconds between checks (60 by default), or 0 to turn the check off",
            )
        set_(self, "consumer_check_interval", float(interval))
        set_(self, "connect_timeout", _positive("connect_timeout", self.connect_timeout))
        set_(self, "socket_timeout", _positive("socket_timeout", self.socket_timeout))
        set_(self, "cooldown", _positive("cooldown", self.cooldown))
        set_(self, "thresholds", _policy(self.thresholds))
        dp = self.default_priority
        if isinstance(dp, bool) or not isinstance(dp, int) or not MOST_URGENT <= dp <= LEAST_URGENT:
            raise ConfigurationError(
                "default_priority",
                f"{dp!r} is outside {MOST_URGENT}..{LEAST_URGENT}",
                "use a whole number from 1 (most urgent) to 9 (least); the default is 5",
            )
        for name in ("key_prefix", "client_id_header", "client_id_kwarg"):
            value = getattr(self, name)
            if not isinstance(value, str) or not value:
                raise ConfigurationError(name, f"{value!r} is not a non-empty string", "give a name")
        if "{" in self.key_prefix or "}" in self.key_prefix:
            raise ConfigurationError(
                "key_prefix",
                f"{self.key_prefix!r} contains a brace",
                "drop the { } characters: the router adds its own Redis Cluster hash tag",
            )
        if self.client_id_getter is not None and not callable(self.client_id_getter):
            raise ConfigurationError(
                "client_id_getter",
                f"{self.client_id_getter!r} is not callable",
                "pass a function (task_name, args, kwargs, headers) -> client id, or None",
            )
        set_(self, "tasks", _tasks(self.tasks))
        port = self.metrics_port
        if port is not None and (
            isinstance(port, bool) or not isinstance(port, int) or not 0 <= port <= 65535
        ):
            raise ConfigurationError(
                "metrics_port", f"{port!r} is not a TCP port", "use 1..65535 (0 picks a free one), or None"
            )
        if not isinstance(self.flower_kwargsrepr, bool):
            raise ConfigurationError(
                "flower_kwargsrepr", f"{self.flower_kwargsrepr!r} is not a bool", "use True or False"
            )

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None, **overrides: Any) -> RouterConfig:
        """Settings from ``PRIORITY_ROUTER_*`` variables; ``overrides`` win over them."""
        environ = os.environ if environ is None else environ
        values: dict[str, Any] = {}
        for f in fields(cls):
            if f.name in ("thresholds", "client_id_getter"):
                continue
            raw = environ.get(ENV_PREFIX + f.name.upper())
            if raw is not None and f.name not in overrides:
                values[f.name] = _parse_env(f.name, raw)
        values.update({k: v for k, v in overrides.items() if v is not None})
        return cls(**values)


_INT_HINTS = {"default_priority": "set it to 1..9", "metrics_port": "set it to a port, e.g. 9808"}


def _parse_env(name: str, raw: str) -> Any:
    env = ENV_PREFIX + name.upper()
    if name in ("reset_interval", "connect_timeout", "socket_timeout", "cooldown", "consumer_check_interval"):
        try:
            return float(raw)
        except ValueError:
            raise ConfigurationError(
                env, f"{raw!r} is not a number", "set it to seconds, e.g. 1500"
            ) from None
    if name in _INT_HINTS:
        try:
            return int(raw)
        except ValueError:
            raise ConfigurationError(env, f"{raw!r} is not a whole number", _INT_HINTS[name]) from None
    if name == "flower_kwargsrepr":
        lowered = raw.strip().lower()
        if lowered in ("1", "true", "yes", "on"):
            return True
        if lowered in ("0", "false", "no", "off"):
            return False
        raise ConfigurationError(env, f"{raw!r} is not a boolean", "set it to true or false")
    if name == "tasks":
        return tuple(t.strip() for t in raw.split(",") if t.strip()) or None
    return raw


def _positive(name: str, value: object) -> float:
    if (
        isinstance(value, bool)
        or not isinstance(value, int | float)
        or not math.isfinite(value)
        or value <= 0
    ):
        raise ConfigurationError(name, f"{value!r} is not a positive number of seconds", "use a value > 0")
    return float(value)


def _policy(value: object) -> Policy:
    if isinstance(value, Policy):
        return value
    if isinstance(value, Iterable) and not isinstance(value, str | bytes):
        return Policy.from_rows(value)
    raise ConfigurationError(
        "thresholds",
        f"{value!r} is not a threshold table",
        "pass a Policy or (limit, priority) rows, e.g. DOCBITS_THRESHOLDS",
    )


def _tasks(value: object) -> tuple[str, ...] | None:
    if value is None:
        return None
    if isinstance(value, str):
        value = [value]  # one name or glob, not a sequence of one-letter patterns
    if isinstance(value, Iterable):
        value = list(value)
    if not isinstance(value, list) or not all(isinstance(t, str) and t for t in value):
        raise ConfigurationError(
            "tasks", f"{value!r} is not a list of task names", "pass names or globs, e.g. ['docs.*']"
        )
    return tuple(value)


def _check_redis_url(url: object) -> str:
    from .store.connection import check_url

    return check_url(url)
