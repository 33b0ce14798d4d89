"""Exceptions raised by priority-router."""

from __future__ import annotations


class PriorityRouterError(Exception):
    """Base class of every error priority-router raises."""


class ConfigurationError(PriorityRouterError, ValueError):
    """A setting is invalid.

    The message names the setting, the value it got and how to fix it.
    """

    def __init__(self, setting: str, problem: str, fix: str) -> None:
        self.setting = setting
        self.problem = problem
        self.fix = fix
        super().__init__(f"{setting}: {problem}. Fix: {fix}")


class CounterUnavailable(PriorityRouterError):
    """The counter store could not answer (down, slow or refusing)."""
