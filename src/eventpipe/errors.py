"""Errors every layer shares.

An error carries a stable ``name``, the values involved and, where there is one, the fix.
Destinations and senders classify failures as :class:`TransientError` (retry with backoff)
or :class:`TerminalError` (the event goes to ``failed/`` with the reason); nothing guesses.
"""

from __future__ import annotations

from typing import Any


class EventpipeError(Exception):
    """Base of eventpipe's own errors: a stable name, fields, and what to do next."""

    name = "eventpipe_error"

    def __init__(self, message: str, *, fix: str | None = None, **fields: Any) -> None:
        super().__init__(message)
        self.message = message
        self.fix = fix
        self.fields = fields

    def __str__(self) -> str:
        if self.fix:
            return f"{self.message} (fix: {self.fix})"
        return self.message


class ConfigError(EventpipeError):
    """The configuration cannot be used; the message names every wrong key by its path."""

    name = "config_error"


class TransientError(EventpipeError):
    """A failure that may pass by itself (connection lost, disk full): retry with backoff."""

    name = "transient_error"


class TerminalError(EventpipeError):
    """A failure that retrying cannot fix: the event goes to failed/ with this reason."""

    name = "terminal_error"


class DataDirLockedError(EventpipeError):
    """Another collector already owns this data directory."""

    name = "data_dir_locked"
