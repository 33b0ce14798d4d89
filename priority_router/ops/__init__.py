"""Operator tools: the ``priority-router`` command, ``doctor`` and queue depths."""
