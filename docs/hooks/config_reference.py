"""An mkdocs hook: writes the configuration reference from RouterConfig's own fields.

A page that holds the line ``{{ config_reference }}`` gets, in its place, one table row per
setting: its name, constructor keyword, environment variable, Celery setting, default and
meaning, all read from :class:`priority_router.RouterConfig` (its field metadata), so the
reference cannot drift from the code.
"""

from __future__ import annotations

from dataclasses import MISSING, fields
from typing import Any

from priority_router.config import CELERY_PREFIX, ENV_PREFIX, RouterConfig

MARKER = "{{ config_reference }}"


def reference_table() -> str:
    rows = [
        "| setting: the constructor keyword | environment variable<br>Celery setting | default | meaning |",
        "|---|---|---|---|",
    ]
    for position, f in enumerate(fields(RouterConfig)):
        keyword = f"`{f.name}`" if position else f"`{f.name}`<br>(or the first positional argument)"
        env = f"`{ENV_PREFIX}{f.name.upper()}`" if f.metadata["text"] is not None else "(Python only)"
        rows.append(
            f"| {keyword} | {env}<br>`{CELERY_PREFIX}{f.name}` "
            f"| {_default(f.default, f.metadata['shown'])} | {f.metadata['meaning']} |"
        )
    return "\n".join(rows)


def _default(value: Any, shown: str | None) -> str:
    if shown is not None:
        return f"`{shown}`"
    if value is MISSING or value is None:
        return "None"
    if isinstance(value, float) and value.is_integer():
        return f"`{value:g}`"
    if isinstance(value, str):
        return f'`"{value}"`'
    return f"`{value!r}`"


def on_page_markdown(markdown: str, **kwargs: Any) -> str:
    if MARKER in markdown:
        return markdown.replace(MARKER, reference_table())
    return markdown
