"""The router's settings: one frozen, validated object, and the three places they come from.

Each field of :class:`RouterConfig` is a setting.  The same name is a keyword of
``PriorityRouter(...)``, an environment variable ``PRIORITY_ROUTER_<NAME>`` (read by
``from_env``) and a Celery setting ``priority_router_<name>`` (read from the app the router
is installed on; ``CELERY_PRIORITY_ROUTER_<NAME>`` in a Django settings module with the
``CELERY`` namespace).  A setting is added here and nowhere else.
"""

from __future__ import annotations

import difflib
import math
import os
from collections.abc import Callable, Iterable, Mapping
from dataclasses import Field, dataclass, field, fields
from typing import Any

from .errors import ConfigurationError
from .policy import DEFAULT_THRESHOLDS, Policy, check_priority

#: Called as ``getter(task_name, args, kwargs, headers)``; returns a client id or None.
ClientIdGetter = Callable[[str, tuple[Any, ...], dict[str, Any], dict[str, Any]], object]
#: ``cost_getter(task_name, args, kwargs, headers)``: a document's cost, or None for 1.
CostGetter = Callable[[str, tuple[Any, ...], dict[str, Any], dict[str, Any]], object]

ENV_PREFIX = "PRIORITY_ROUTER_"
CELERY_PREFIX = "priority_router_"
#: Fields that only Python can give (not an environment variable's text).
_PYTHON_ONLY = {"not_text": True}
#: Shortest idle reset accepted, in seconds.
MIN_RESET_INTERVAL = 1.0
#: The counting modes: what a client's pending count measures.
MODES = ("seed", "inflight")


@dataclass(frozen=True)
class RouterConfig:
    """Every setting of a :class:`~priority_router.PriorityRouter`, validated on creation.

    Every field except ``thresholds`` and ``client_id_getter`` can also be given as text
    (an environment variable, or a string in Celery's configuration).
    """

    redis_url: str = "redis://localhost:6379/0"
    reset_interval: float = 1500.0
    thresholds: Policy = field(default=DEFAULT_THRESHOLDS, metadata=_PYTHON_ONLY)
    default_priority: int = 5
    key_prefix: str = "priority-router:"
    client_id_header: str = "client_id"
    client_id_kwarg: str = "client_id"
    client_id_getter: ClientIdGetter | None = field(default=None, metadata=_PYTHON_ONLY)
    #: A document's cost when its ``priority_router_cost`` header gives none; None: 1.
    cost_getter: CostGetter | None = field(default=None, metadata=_PYTHON_ONLY)
    #: Task names or globs whose publishes are counted; None counts every task.
    tasks: tuple[str, ...] | None = None
    #: Seconds the counter may take to connect / to answer before publishing fails open.
    connect_timeout: float = 0.05
    socket_timeout: float = 0.05
    #: Seconds the router stops asking a failed counter store before probing again.
    cooldown: float = 5.0
    #: Append the decision to each message's ``kwargsrepr`` so Flower shows and finds it.
    flower_kwargsrepr: bool = True
    #: Record Prometheus metrics in the default registry (needs the ``metrics`` extra).
    metrics: bool = False
    #: Port on which each worker serves Prometheus metrics; implies ``metrics``.
    metrics_port: int | None = None
    #: Seconds between a publisher's checks that every worker consuming its queues can
    #: see every priority it sends (0 turns the check off).
    consumer_check_interval: float = 60.0
    #: Decide, count and show each document's priority (headers, Flower, metrics, CLI)
    #: without applying it: the broker and the app get what plain Celery gives them.
    dry_run: bool = False
    #: What a client's count measures: "seed" (documents submitted in the busy spell, the
    #: published scheme) or "inflight" (documents published and not yet finished).
    mode: str = "seed"
    #: Seconds after which a waiting document is served before fresher ones, oldest first,
    #: whatever its priority (anti-starvation; Redis broker only).  None turns it off.
    max_wait: float | None = None
    #: Read each client's tier (``priority-router tier set``) inside its check, and the
    #: default tier every few seconds.  False sends the bare check and ignores tiers.
    tiers: bool = True
    #: Seconds a worker's gated document keeps its client's slot (``max_in_flight``) without
    #: the worker renewing it: a crashed worker's slots come back within this time.
    lease: float = 30.0

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
        set_(self, "lease", _positive("lease", self.lease))
        if self.lease < 3:
            raise ConfigurationError(
                "lease",
                f"{self.lease!r} s is under 3 s: workers renew leases every lease/3 seconds, and a lease "
                "shorter than a few round trips lapses under load",
                "use seconds >= 3; 30 by default",
            )
        set_(self, "thresholds", _policy(self.thresholds))
        if self.max_wait is not None:
            set_(self, "max_wait", _max_wait(self.max_wait))
        check_priority("default_priority", self.default_priority)
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
        if self.cost_getter is not None and not callable(self.cost_getter):
            raise ConfigurationError(
                "cost_getter",
                f"{self.cost_getter!r} is not callable",
                "pass a function (task_name, args, kwargs, headers) -> cost (a positive number), or None",
            )
        set_(self, "tasks", _tasks(self.tasks))
        if self.mode not in MODES:
            raise ConfigurationError(
                "mode", f"{self.mode!r} is not a counting mode", f"use one of {', '.join(MODES)}"
            )
        port = self.metrics_port
        if port is not None and (
            isinstance(port, bool) or not isinstance(port, int) or not 0 <= port <= 65535
        ):
            raise ConfigurationError(
                "metrics_port", f"{port!r} is not a TCP port", "use 1..65535 (0 picks a free one), or None"
            )
        for name in ("flower_kwargsrepr", "metrics", "dry_run", "tiers"):
            if not isinstance(getattr(self, name), bool):
                raise ConfigurationError(name, f"{getattr(self, name)!r} is not a bool", "use True or False")

    @classmethod
    def from_mapping(cls, values: Mapping[str, Any], source: Callable[[str], str] = str) -> RouterConfig:
        """Settings by name; ``source(name)`` names where a value came from, in errors."""
        known = {f.name for f in fields(cls)}
        for name in values:
            if name not in known:
                raise ConfigurationError(
                    source(name),
                    "is not a priority-router setting",
                    f"use one of {', '.join(sorted(known))}" + _did_you_mean(name, known),
                )
        return cls(**values)

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None, **overrides: Any) -> RouterConfig:
        """Settings from ``PRIORITY_ROUTER_*`` variables; ``overrides`` that are not None win."""
        given = {k: v for k, v in overrides.items() if v is not None}
        return cls.from_mapping({**env_values(environ), **given}, _env_name)

    def as_dict(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in fields(self)}


def env_values(environ: Mapping[str, str] | None = None) -> dict[str, Any]:
    """The settings ``PRIORITY_ROUTER_*`` variables give, parsed from their text."""
    environ = os.environ if environ is None else environ
    found = {}
    for f in fields(RouterConfig):
        raw = environ.get(_env_name(f.name))
        if raw is not None and not f.metadata.get("not_text"):
            found[f.name] = _parse(f, raw, _env_name(f.name))
    return found


def celery_values(conf: Mapping[str, Any]) -> dict[str, Any]:
    """The settings a Celery app's configuration gives (``priority_router_*``); text
    values (a Django setting read from the environment, say) are parsed."""
    found = {}
    for f in fields(RouterConfig):
        value = conf.get(celery_name(f.name))
        if value is not None:
            found[f.name] = _parse(f, value, celery_name(f.name)) if isinstance(value, str) else value
    return found


def unknown_celery_settings(conf: Mapping[str, Any]) -> list[str]:
    """``priority_router_*`` keys in a Celery configuration that name no setting (typos)."""
    known = {f.name for f in fields(RouterConfig)}
    unknown = []
    for key in conf:
        lowered = str(key).lower()
        if CELERY_PREFIX in lowered and lowered.split(CELERY_PREFIX, 1)[1] not in known:
            unknown.append(str(key))
    return sorted(unknown)


def _parse(f: Field[Any], raw: str, where: str) -> Any:
    if f.type == "str" or f.metadata.get("not_text"):
        return raw
    return _from_text(f.name, str(f.type), raw, where)


def celery_name(name: str) -> str:
    return CELERY_PREFIX + name


def _env_name(name: str) -> str:
    return ENV_PREFIX + name.upper()


def _did_you_mean(name: str, known: set[str]) -> str:
    close = difflib.get_close_matches(name, list(known), n=1)
    return f" (did you mean {close[0]}?)" if close else ""


def _from_text(name: str, kind: str, raw: str, where: str) -> Any:
    text = raw.strip()
    if "None" in kind and text.lower() in ("", "none"):
        return None
    if name == "tasks":
        return tuple(t.strip() for t in text.split(",") if t.strip()) or None
    if kind.startswith("bool"):
        if text.lower() in ("1", "true", "yes", "on"):
            return True
        if text.lower() in ("0", "false", "no", "off"):
            return False
        raise ConfigurationError(where, f"{raw!r} is not a boolean", "set it to true or false")
    if kind.startswith("float"):
        try:
            return float(text)
        except ValueError:
            raise ConfigurationError(
                where, f"{raw!r} is not a number", "set it to seconds, e.g. 1500"
            ) from None
    if kind.startswith("int"):
        try:
            return int(text)
        except ValueError:
            raise ConfigurationError(
                where, f"{raw!r} is not a whole number", "write digits, e.g. 5"
            ) from None
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


def _max_wait(value: object) -> float:
    if (
        isinstance(value, bool)
        or not isinstance(value, int | float)
        or not math.isfinite(value)
        or value <= 0
    ):
        raise ConfigurationError(
            "max_wait",
            f"{value!r} is not a positive number of seconds",
            "use the seconds after which a waiting document goes first (e.g. 300), or None for off",
        )
    return float(value)


def _policy(value: object) -> Policy:
    if isinstance(value, Policy):
        return value
    if isinstance(value, Iterable) and not isinstance(value, str | bytes):
        return Policy.from_rows(value)
    raise ConfigurationError(
        "thresholds",
        f"{value!r} is not a threshold table",
        "pass a Policy or (limit, priority) rows, e.g. DEFAULT_THRESHOLDS",
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
