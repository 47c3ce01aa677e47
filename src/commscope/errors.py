"""The error a user's input can cause.

``ConfigError`` is a ``ValueError`` that names the field, the value and what would be valid.
The command line turns it into one line on stderr and exit status 2.
"""

from __future__ import annotations

from typing import Any


class ConfigError(ValueError):
    """A user's input is invalid: ``tp=3 must divide num_heads=32``."""

    def __init__(self, field: str, value: Any, expected: str, *, source: str | None = None) -> None:
        self.field = field
        self.value = value
        self.expected = expected
        self.source = source
        where = f"{source}: " if source else ""
        super().__init__(f"{where}{field}={value!r}: {expected}")


class JobFailed(RuntimeError):
    """A job commscope started failed (a rank died or hung). The command line prints its one-line message and
    exits with status 1: not the user's input, but not a crash of commscope either."""


def check(condition: bool, field: str, value: Any, expected: str) -> None:
    """Raise :class:`ConfigError` unless ``condition`` holds."""
    if not condition:
        raise ConfigError(field, value, expected)
