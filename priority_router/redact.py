"""Keeping credentials out of logs and CLI output."""

from __future__ import annotations

from urllib.parse import urlsplit, urlunsplit


def redact_url(url: str) -> str:
    """``url`` with any password replaced by ``***``."""
    try:
        parts = urlsplit(url)
    except ValueError:
        return "<unparseable url>"
    # The netloc is split by hand: a Sentinel or Cluster URL lists several host:port
    # pairs, which urlsplit's port and hostname cannot read.
    userinfo, at, hosts = parts.netloc.rpartition("@")
    if not at or ":" not in userinfo:
        return url
    user = userinfo.split(":", 1)[0]
    return urlunsplit((parts.scheme, f"{user}:***@{hosts}", parts.path, parts.query, parts.fragment))


class HiddenURL(str):
    """A URL whose text has its password masked (:func:`redact_url`), with the URL itself in
    ``url``: what a Celery setting holds once the router has read the store's URL from it,
    since Celery prints the settings whose names it does not take for secrets
    (``celery inspect conf``, ``celery report``, Flower's configuration tab)."""

    url: str

    def __new__(cls, url: str) -> HiddenURL:
        hidden = super().__new__(cls, redact_url(url))
        hidden.url = url
        return hidden

    def __reduce__(self) -> tuple[type[HiddenURL], tuple[str]]:
        return HiddenURL, (self.url,)
