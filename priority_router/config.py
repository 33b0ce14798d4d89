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
from collections.abc import Callable, Iterable, Mapping, MutableMapping
from dataclasses import Field, dataclass, field, fields
from typing import Any

from .errors import ConfigurationError
from .redact import HiddenURL, redact_url
from .redis_urls import check_url
from .thresholds import DEFAULT_THRESHOLDS, Policy, check_priority, parse_table

#: Called as ``getter(task_name, args, kwargs, headers)``; returns a client id or None.
ClientIdGetter = Callable[[str, tuple[Any, ...], dict[str, Any], dict[str, Any]], object]
#: ``cost_getter(task_name, args, kwargs, headers)``: a document's cost, or None for 1.
CostGetter = Callable[[str, tuple[Any, ...], dict[str, Any], dict[str, Any]], object]

ENV_PREFIX = "PRIORITY_ROUTER_"
CELERY_PREFIX = "priority_router_"
#: Shortest idle reset accepted, in seconds.
MIN_RESET_INTERVAL = 1.0
#: The counting modes: what a client's pending count measures.
MODES = ("seed", "inflight")

#: Turns a setting's text (an environment variable, a string in Celery's configuration)
#: into its value; the second argument names where the text came from, for errors.
TextParser = Callable[[str, str], Any]


def _text(raw: str, where: str) -> str:
    return raw


def _seconds(raw: str, where: str) -> float:
    try:
        return float(raw.strip())
    except ValueError:
        raise ConfigurationError(where, f"{raw!r} is not a number", "set it to a number of seconds") from None


def _whole(raw: str, where: str) -> int:
    try:
        return int(raw.strip())
    except ValueError:
        raise ConfigurationError(where, f"{raw!r} is not a whole number", "write digits, e.g. 5") from None


def _flag(raw: str, where: str) -> bool:
    text = raw.strip().lower()
    if text in ("1", "true", "yes", "on"):
        return True
    if text in ("0", "false", "no", "off"):
        return False
    raise ConfigurationError(where, f"{raw!r} is not a boolean", "set it to true or false")


def _names(raw: str, where: str) -> tuple[str, ...] | None:
    return tuple(t.strip() for t in raw.split(",") if t.strip()) or None


def _or_none(parse: TextParser) -> TextParser:
    def parse_or_none(raw: str, where: str) -> Any:
        return None if raw.strip().lower() in ("", "none") else parse(raw, where)

    return parse_or_none


def setting(default: Any, meaning: str, text: TextParser | None = _text, shown: str | None = None) -> Any:
    """A :class:`RouterConfig` field: its default, what it means (the configuration
    reference's text), how its text is parsed (None: Python only, no environment variable),
    and how the reference shows its default when ``repr`` would not do."""
    return field(default=default, metadata={"meaning": meaning, "text": text, "shown": shown})


@dataclass(frozen=True)
class RouterConfig:
    """Every setting of a :class:`~priority_router.PriorityRouter`, validated on creation.

    Each field's metadata holds its meaning and how its text is parsed; the configuration
    reference (docs/configuration.md) is generated from it.
    """

    redis_url: str = setting(
        "redis://localhost:6379/0",
        "The counter store: `redis://`, `rediss://` (TLS), `unix://`, "
        "`redis+sentinel://host:26379[,host2:26379]/service_name[/db]` or "
        "`redis+cluster://host:port[,host:port]`. A query gives redis-py's connection options; "
        "over TLS, name the server's CA with `?ssl_cert_reqs=required&ssl_ca_certs=/path/ca.pem`; "
        "a name redis-py has no option for is refused. An ACL user: `redis://USER:PASSWORD@host` "
        "(the rules it needs: [deployment](deployment.md#a-redis-user-for-the-router)).",
    )
    reset_interval: float = setting(
        1500.0,
        "Seconds without a document after which a client's count starts again from 0 (at least 1).",
        _seconds,
    )
    thresholds: Policy = setting(
        DEFAULT_THRESHOLDS,
        "The table that turns a pending count into a priority: `default` (the scheme's), `wide` "
        "(deeper, for several heavy clients: docs/scheme.md), a `Policy`, or `(limit, priority)` "
        "rows (as text `-20:9,-14:8,...`).",
        parse_table,
        "default",
    )
    default_priority: int = setting(
        5,
        "The priority of a document without a client id, and of one the counter store cannot count "
        "though it answers (another release's store).",
        _whole,
    )
    key_prefix: str = setting("priority-router:", "The prefix of every key the router writes (no braces).")
    client_id_header: str = setting("client_id", "The message header that names a document's client.")
    client_id_kwarg: str = setting(
        "client_id", "The task keyword argument that names the client when the header does not."
    )
    client_id_getter: ClientIdGetter | None = setting(
        None,
        "`f(task_name, args, kwargs, headers) -> client id`, asked when neither the header nor "
        "the keyword names one.",
        None,
    )
    cost_getter: CostGetter | None = setting(
        None,
        "`f(task_name, args, kwargs, headers) -> cost`, asked when a publish has no "
        "`priority_router_cost` header; None counts 1.",
        None,
    )
    tasks: tuple[str, ...] | None = setting(
        None,
        "Task names or globs whose publishes are counted (a string is split at commas: "
        "`docs.*,billing.*`); None counts every task.",
        _or_none(_names),
    )
    connect_timeout: float = setting(
        0.05, "Seconds the counter store may take to connect before a publish fails open.", _seconds
    )
    socket_timeout: float = setting(
        0.1, "Seconds the counter store may take to answer before a publish fails open.", _seconds
    )
    cooldown: float = setting(
        1.0,
        "Longest time between two background probes of a failed counter store: the first comes "
        "50 ms after the failure, each next one twice as late, up to this.",
        _seconds,
    )
    flower_kwargsrepr: bool = setting(
        True, "Append each document's decision to its `kwargsrepr`, so Flower shows and finds it.", _flag
    )
    metrics: bool = setting(
        False, "Record Prometheus metrics in the default registry (the `metrics` extra).", _flag
    )
    metrics_port: int | None = setting(
        None, "The port on which each worker serves Prometheus metrics; implies `metrics`.", _or_none(_whole)
    )
    consumer_check_interval: float = setting(
        0.0,
        "Seconds between a publisher's checks that every worker consuming its queues can see "
        "every priority it sends (each a broadcast to every worker); 0, the default, leaves the "
        "check to each router worker's start and `doctor`. On Redis, publishers also look at the "
        "priority lists they published to, without a broadcast, whatever this is "
        "(docs/troubleshooting.md).",
        _seconds,
    )
    dry_run: bool = setting(
        False,
        "Decide, count and show each document's priority without applying it: the broker and "
        "the app get what plain Celery gives them.",
        _flag,
    )
    mode: str = setting(
        "seed",
        "What a client's count measures: `seed` (documents submitted in the busy spell, the "
        "specified scheme) or `inflight` (documents published and not yet finished).",
    )
    max_wait: float | None = setting(
        None,
        "Seconds after which a waiting document is served before fresher ones, oldest first "
        "(Redis broker only); None turns it off.",
        _or_none(_seconds),
    )
    tiers: bool = setting(
        True,
        "Read each client's tier inside its check once any tier is stored, and the default "
        "tier every few seconds; False ignores tiers.",
        _flag,
    )
    lease: float = setting(
        30.0,
        "Seconds a worker's gated document keeps its client's slot without the worker renewing "
        "it: a killed worker's slots come back within this time (at least 3).",
        _seconds,
    )

    def __post_init__(self) -> None:
        set_ = object.__setattr__
        set_(self, "redis_url", check_url(self.redis_url))
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
                "use seconds between checks (such as 60), or 0, the default, to leave the check "
                "to worker starts and doctor",
            )
        set_(self, "consumer_check_interval", float(interval))
        for name in ("connect_timeout", "socket_timeout", "cooldown", "lease"):
            set_(self, name, _positive(name, getattr(self, name)))
        if self.lease < 3:
            raise ConfigurationError(
                "lease",
                f"{self.lease!r} s is under 3 s: workers renew leases every lease/3 seconds, and a lease "
                "shorter than a few round trips lapses under load",
                "use seconds >= 3; 30 by default",
            )
        set_(self, "thresholds", _policy(self.thresholds))
        if self.max_wait is not None:
            fix = "use the seconds after which a waiting document goes first (e.g. 300), or None for off"
            set_(self, "max_wait", _positive("max_wait", self.max_wait, fix))
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
        for name, returns in (("client_id_getter", "client id"), ("cost_getter", "cost (a positive number)")):
            getter = getattr(self, name)
            if getter is not None and not callable(getter):
                fix = f"pass a function (task_name, args, kwargs, headers) -> {returns}, or None"
                raise ConfigurationError(name, f"{getter!r} is not callable", fix)
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

    def __repr__(self) -> str:
        # Written by hand so that a logged config never shows the store's password.
        shown = ", ".join(
            f"{f.name}={redact_url(self.redis_url)!r}"
            if f.name == "redis_url"
            else f"{f.name}={getattr(self, f.name)!r}"
            for f in fields(self)
        )
        return f"RouterConfig({shown})"

    def as_dict(self) -> dict[str, Any]:
        """Every setting by name."""
        return {f.name: getattr(self, f.name) for f in fields(self)}


def env_values(environ: Mapping[str, str] | None = None) -> dict[str, Any]:
    """The settings ``PRIORITY_ROUTER_*`` variables give, parsed from their text."""
    environ = os.environ if environ is None else environ
    found = {}
    for f in fields(RouterConfig):
        raw = environ.get(_env_name(f.name))
        if raw is not None and f.metadata["text"] is not None:
            found[f.name] = _parse(f, raw, _env_name(f.name))
    return found


def celery_values(conf: Mapping[str, Any]) -> dict[str, Any]:
    """The settings a Celery app's configuration gives (``priority_router_*``); text
    values (a Django setting read from the environment, say) are parsed."""
    found = {}
    for f in fields(RouterConfig):
        value = conf.get(celery_name(f.name))
        if isinstance(value, HiddenURL):
            value = value.url
        if value is not None:
            found[f.name] = _parse(f, value, celery_key(conf, f.name)) if isinstance(value, str) else value
    return found


def hide_store_password(conf: MutableMapping[str, Any]) -> None:
    """Mask the password of the store's URL in a Celery configuration, once read: Celery
    masks the values of settings named like secrets (``*_PASSWORD``, ``*_KEY``) and of its
    broker and backend URLs, not ``priority_router_redis_url``, so ``celery inspect conf``
    and ``celery report`` printed it.  The setting reads as the URL with ``***``;
    :func:`celery_values` still reads the URL itself, and a new value set later is
    followed, then masked in turn."""
    key = celery_key(conf, "redis_url")
    value = conf.get(key)
    if isinstance(value, str) and not isinstance(value, HiddenURL) and redact_url(value) != value:
        conf[key] = HiddenURL(value)


def celery_key(conf: Mapping[str, Any], name: str) -> str:
    """Setting ``name``'s key in a Celery configuration as the user wrote it
    (``CELERY_PRIORITY_ROUTER_MODE`` in a Django settings module), for messages."""
    for key in map(str, conf):
        at = key.lower().find(CELERY_PREFIX)
        if at >= 0 and key[at + len(CELERY_PREFIX) :].lower() == name:
            return key
    return celery_name(name)


def unknown_celery_settings(conf: Mapping[str, Any]) -> dict[str, str | None]:
    """``priority_router_*`` keys in a Celery configuration that name no setting (typos),
    each with the closest setting's name as the configuration reads it (in Django's
    ``CELERY`` namespace ``CELERY_PRIORITY_ROUTER_REDIS_URL``), or None; and keys that name
    a setting as Celery does not read it (``PRIORITY_ROUTER_MODE`` in a configuration
    module, the environment variable's name), each as it reads it."""
    known = [f.name for f in fields(RouterConfig)]
    unknown: dict[str, str | None] = {}
    for key in sorted(map(str, conf)):
        at = key.lower().find(CELERY_PREFIX)
        if at < 0:
            continue
        name = key[at + len(CELERY_PREFIX) :].lower()
        if name not in known:
            close = difflib.get_close_matches(name, known, n=1)
            unknown[key] = celery_form(conf, close[0]) if close else None
        elif conf.get(key) is not None and conf.get(celery_name(name)) is None:
            unknown[key] = celery_form(conf, name)
    return unknown


#: ``PRIORITY_ROUTER_*`` variables that are not settings: the test suite's services and the
#: migrate kill matrix's step (``ops/migrate_rabbitmq.py``).
NOT_SETTINGS = ("PRIORITY_ROUTER_TEST_", "PRIORITY_ROUTER_MIGRATE_KILL_AFTER")


def unknown_env_settings(environ: Mapping[str, str] | None = None) -> dict[str, str | None]:
    """``PRIORITY_ROUTER_*`` variables that name no setting (typos), each with the closest
    setting's variable, or None."""
    environ = os.environ if environ is None else environ
    known = [_env_name(f.name) for f in fields(RouterConfig)]
    unknown: dict[str, str | None] = {}
    for key in sorted(environ):
        if key.startswith(ENV_PREFIX) and key not in known and not key.startswith(NOT_SETTINGS):
            close = difflib.get_close_matches(key, known, n=1)
            unknown[key] = close[0] if close else None
    return unknown


def with_closest(unknown: Mapping[str, str | None]) -> str:
    """Unknown setting names, each with the closest known one: ``a (did you mean b?), c``."""
    return ", ".join(k if near is None else f"{k} (did you mean {near}?)" for k, near in unknown.items())


def celery_form(conf: Mapping[str, Any], name: str) -> str:
    """Setting ``name`` as a Celery configuration reads it: ``priority_router_mode``, or in
    a namespace (Django's ``CELERY``) ``CELERY_PRIORITY_ROUTER_MODE``."""
    prefix = getattr(conf, "prefix", None)
    return f"{prefix}{celery_name(name).upper()}" if prefix else celery_name(name)


def _parse(f: Field[Any], raw: str, where: str) -> Any:
    parse = f.metadata["text"]
    return raw if parse is None else parse(raw, where)


def celery_name(name: str) -> str:
    return CELERY_PREFIX + name


def _env_name(name: str) -> str:
    return ENV_PREFIX + name.upper()


def _did_you_mean(name: str, known: set[str]) -> str:
    close = difflib.get_close_matches(name, list(known), n=1)
    return f" (did you mean {close[0]}?)" if close else ""


def _positive(name: str, value: object, fix: str = "use a value > 0") -> float:
    if (
        isinstance(value, bool)
        or not isinstance(value, int | float)
        or not math.isfinite(value)
        or value <= 0
    ):
        raise ConfigurationError(name, f"{value!r} is not a positive number of seconds", fix)
    return float(value)


def _policy(value: object) -> Policy:
    if isinstance(value, Policy):
        return value
    if isinstance(value, str):
        return parse_table(value)
    if isinstance(value, Iterable) and not isinstance(value, str | bytes):
        return Policy.from_rows(value)
    raise ConfigurationError(
        "thresholds",
        f"{value!r} is not a threshold table",
        "pass a table's name (default, wide), a Policy or (limit, priority) rows",
    )


def _tasks(value: object) -> tuple[str, ...] | None:
    if value is None:
        return None
    if isinstance(value, str):
        # Split at commas as the environment variable is, not into one-letter patterns.
        names = _names(value, "tasks")
        if names is None:
            raise ConfigurationError(
                "tasks", f"{value!r} names no task", "pass None to count every task, or names or globs"
            )
        return names
    if isinstance(value, Iterable):
        value = list(value)
    if not isinstance(value, list) or not all(isinstance(t, str) and t for t in value):
        raise ConfigurationError(
            "tasks",
            f"{value!r} is not a list of task names",
            "pass names or globs, e.g. ['docs.*'] or 'docs.*,billing.*'",
        )
    return tuple(value)
