"""The ``priority-router`` group and what its commands share: the counter-store options
(accepted before or after the subcommand), ``-A`` and ``--json``, the router a command uses,
and how a command fails.  The commands live in ``cli.py``, ``tier_cli.py`` and ``simulate.py``.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import sys
from typing import Any, NoReturn

import click
import redis
from rich.console import Console
from rich.measure import Measurement
from rich.table import Table

from ..config import MODES, RouterConfig
from ..errors import ConfigurationError
from ..integration.install import settings_error
from ..redact import redact_url
from ..router import PriorityRouter, engine_of, installed_router
from ..store.breaker import STORE_ERRORS
from ..store.connection import failing_nodes_note, make_client, ping_every_master, store_error
from ..store.permissions import acl_user, refusal

console = Console()

app_option = click.option(
    "-A", "--app", "app_name", default=None, help="The Celery app, as for `celery -A` (required)."
)
json_option = click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
router_app_option = click.option(
    "-A",
    "--app",
    "app_name",
    default=None,
    help="Use the router installed on this Celery app (its Redis, key prefix and thresholds).",
)


class Context:
    def __init__(self, app_name: str | None, **overrides: Any) -> None:
        #: ``-A`` given before the subcommand, as ``celery -A app worker`` has it.
        self.app_name = app_name
        #: The store options given before the subcommand, or read from the environment.
        self._overrides = overrides
        self._router: PriorityRouter | None = None
        #: Store options typed on the command line (not read from the environment): with
        #: ``-A``, these win over the app's own settings.
        self.typed: dict[str, Any] = {}

    def override(self, name: str, value: object) -> None:
        """A store option given after the subcommand wins over one given before it."""
        if value is not None:
            self._overrides[name] = value
            self.typed[name] = value
            self._router = None

    @property
    def router(self) -> PriorityRouter:
        if self._router is None:
            self._router = operator_router(RouterConfig.from_env(None, **self._overrides))
        return self._router


def operator_router(config: RouterConfig) -> PriorityRouter:
    # An operator's command may wait longer for Redis than a publish does.
    return PriorityRouter.from_config(dataclasses.replace(config, connect_timeout=2.0, socket_timeout=5.0))


def cannot_read(router: PriorityRouter, exc: Exception) -> str:
    """Why the counter store could not be read, naming the nodes a cluster flags as failing
    (a cluster's own error, "The cluster is down", names none)."""
    failing = failing_nodes_note(engine_of(router).redis)
    fix = engine_of(router).refusal_fix(exc)
    return f"cannot read {redact_url(router.config.redis_url)}: {store_error(exc)}{failing}{fix}"


def fail(message: str, code: int = 1) -> NoReturn:
    click.echo(f"priority-router: {message}", err=True)
    ctx = click.get_current_context(silent=True)
    if ctx is not None and ctx.params.get("as_json"):
        # A script reading --json gets a document on a failure too, not an empty stdout.
        emit_json({"error": message, "exit_code": code})
    sys.exit(code)


def print_table(table: Table) -> None:
    """``table`` on the console: fitted to a terminal's width, or to ``COLUMNS`` when
    set, and at its own width elsewhere (piped, redirected, in a script), where nothing
    wraps at all: cut to Rich's 80 columns, headers broke mid-word ("pendin" / "g")."""
    if console.is_terminal or os.environ.get("COLUMNS", "").strip().isdigit():
        console.print(table)
        return
    # Console.print caps a width at the console's own: a console of the table's width.
    wide = Console(width=10_000)
    Console(width=Measurement.get(wide, wide.options, table).maximum).print(table)


def emit_json(data: Any) -> None:
    click.echo(json.dumps(data, indent=2, default=str))


def load_app(name: str, refuse_bad_settings: bool = True) -> Any:
    """The Celery app ``-A name`` names.  A command refuses (exit 2) an app whose router cannot
    read the app's settings, since it would run on the defaults instead (``doctor``, which
    reports it, passes ``refuse_bad_settings=False``)."""
    from celery.app.utils import find_app

    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        app = find_app(name)
    except Exception as exc:
        fail(
            f"cannot load the Celery app {name!r} ({exc}); pass -A module or module:attribute, "
            "run from the directory that holds the module (as for celery -A) or put it on PYTHONPATH",
            2,
        )
    error = settings_error(app) if refuse_bad_settings else None
    if error is not None:
        fail(f"the router on {name!r} cannot read the app's settings, so it routes nothing: {error}", 2)
    return app


def _after_subcommand(ctx: click.Context, param: click.Parameter, value: object) -> object:
    context = ctx.find_object(Context)
    if context is not None and param.name is not None:
        context.override(param.name, value)
    return value


def store_options(command: Any) -> Any:
    """The counter-store options, also accepted after the subcommand
    (``priority-router status --redis-url ...``).  The environment is read once, by the group."""
    for name, kind, text in (
        ("--reset-interval", float, "Idle seconds before a client's count resets."),
        ("--key-prefix", str, "Key prefix."),
        ("--redis-url", str, "Counter store."),
        ("--mode", click.Choice(MODES), "Counting mode (inflight: documents not yet finished)."),
    ):
        option = click.option(name, type=kind, help=text, expose_value=False, callback=_after_subcommand)
        command = option(command)
    return command


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.option(
    "--redis-url", envvar="PRIORITY_ROUTER_REDIS_URL", help="Counter store [PRIORITY_ROUTER_REDIS_URL]."
)
@click.option(
    "--key-prefix", envvar="PRIORITY_ROUTER_KEY_PREFIX", help="Key prefix [PRIORITY_ROUTER_KEY_PREFIX]."
)
@click.option(
    "--reset-interval",
    type=float,
    envvar="PRIORITY_ROUTER_RESET_INTERVAL",
    help="Idle seconds before a client's count resets [PRIORITY_ROUTER_RESET_INTERVAL, 1500].",
)
@click.option(
    "--mode",
    type=click.Choice(MODES),
    envvar="PRIORITY_ROUTER_MODE",
    help="Counting mode: seed, or inflight (documents not yet finished) [PRIORITY_ROUTER_MODE, seed].",
)
@click.option(
    "-A",
    "--app",
    "app_name",
    default=None,
    help="The Celery app, as for `celery -A` (before or after the subcommand).",
)
@click.version_option(package_name="priority-router")
@click.pass_context
def main(ctx: click.Context, /, **params: Any) -> None:
    """Inspect and manage priority-router's per-client priorities."""
    ctx.obj = Context(**params)
    for name, value in ctx.params.items():
        typed = ctx.get_parameter_source(name) is click.core.ParameterSource.COMMANDLINE
        if name != "app_name" and value is not None and typed:
            ctx.obj.typed[name] = value


def app_name_of(ctx: click.Context, given: str | None) -> str | None:
    """``-A`` after the subcommand, else the one before it."""
    context = ctx.find_object(Context)
    return given if given is not None or context is None else context.app_name


def required_app(ctx: click.Context, given: str | None) -> str:
    name = app_name_of(ctx, given)
    if name is None:
        raise click.UsageError("Missing option '-A' / '--app': the Celery app, as for `celery -A`.")
    return name


def router_for(ctx: click.Context, app_name: str | None = None) -> PriorityRouter:
    app_name = app_name_of(ctx, app_name)
    if app_name is not None:
        installed = installed_router(load_app(app_name))
        if installed is None:
            fail(f"no PriorityRouter is installed on {app_name!r}; call install(app) where it is created", 2)
        # The app's own priority_router_* settings (a celeryconfig module, Django's
        # CELERY_PRIORITY_ROUTER_*) count only once the app has loaded its configuration.
        config = installed.config
        context = ctx.find_object(Context)
        typed = {k: v for k, v in (context.typed if context else {}).items() if getattr(config, k) != v}
        if typed:
            try:
                config = dataclasses.replace(config, **typed)
            except ConfigurationError as exc:
                fail(str(exc), 2)
            given = ", ".join(f"--{k.replace('_', '-')} {redact_url(str(v))}" for k, v in typed.items())
            click.echo(
                f"priority-router: {given} given: used instead of the setting of app {app_name!r}", err=True
            )
        return operator_router(config)
    try:
        context = ctx.find_object(Context)
        assert context is not None, "priority-router commands run under the main group"
        return context.router
    except ConfigurationError as exc:
        fail(str(exc), 2)


#: Seconds the counter store may take to answer a command's first PING: a stopped
#: (SIGSTOP) or paused store otherwise held each command for its longer read timeout.
PING_TIMEOUT = 1.0


def answering_router(ctx: click.Context, app_name: str | None = None) -> PriorityRouter:
    """:func:`router_for`, once its counter store answers a PING within
    :data:`PING_TIMEOUT` (as ``doctor`` checks it); else the command fails at once, saying
    so and what to do."""
    router = router_for(ctx, app_name)
    url = router.config.redis_url
    client = make_client(url, PING_TIMEOUT, PING_TIMEOUT)
    try:
        ping_every_master(client)
    except STORE_ERRORS as exc:
        refused = store_refusal(exc, url, router.config.key_prefix)
        if refused is not None:
            problem, fix = refused
            fail(f"the counter store at {redact_url(url)} {problem}. Fix: {fix}")
        fail(
            f"the counter store at {redact_url(url)} does not answer within {PING_TIMEOUT:g} s "
            f"({store_error(exc)}{failing_nodes_note(client)}): it is stopped, paused or unreachable. "
            "Fix: start or resume it, or point --redis-url / PRIORITY_ROUTER_REDIS_URL (or -A) at one "
            "that answers"
        )
    finally:
        client.close()
    return router


def store_refusal(exc: BaseException, url: str, key_prefix: str) -> tuple[str, str] | None:
    """What the counter store refused, as (problem, fix), where it answered but said no: a
    command (an ACL rule), the URL's user or password, or the TLS handshake; None for a
    store that does not answer.  ``doctor`` and the commands say each with its own fix."""
    refused = refusal(exc)
    if refused is not None:
        return (
            f"answers, but refuses this Redis user {refused.problem()} ({refused.said})",
            refused.fix(acl_user(url), key_prefix),
        )
    said = store_error(exc)
    if isinstance(exc, redis.AuthenticationError) or re.search(r"WRONGPASS|NOAUTH|invalid password", said):
        return (
            f"refuses the URL's user or password ({said})",
            "give redis_url / PRIORITY_ROUTER_REDIS_URL the user and password the server has "
            "(redis://USER:PASSWORD@host:port/db), and check that the user is on (ACL LIST)",
        )
    if re.search(r"\[SSL", said):
        return (
            f"failed the TLS handshake ({said})",
            "name the CA that signed the server's certificate in the URL: "
            "rediss://...?ssl_cert_reqs=required&ssl_ca_certs=/path/to/ca.pem (docs/deployment.md)"
            if "CERTIFICATE_VERIFY_FAILED" in said
            else "check that the port serves TLS (rediss://), and the ssl_* parameters of the URL",
        )
    return None


#: Said wherever a tier is shown for a router configured without tiers.
TIERS_OFF_NOTE = "This router has tiers=False: its publishers ignore every tier."
