"""The web console (docs/console.md)."""

from __future__ import annotations

from pydantic import Field, SecretStr, field_validator

from eventpipe.config.base import Section

MIN_TOKEN_LENGTH = 24
"""Characters an admin token has at least (``openssl rand -hex 16`` makes 32)."""


class ConsoleConfig(Section):
    """The console: pages and a JSON API on what arrives, where it went and what failed,
    behind an admin token. ``eventpipe run`` serves it beside the collector when a token
    is set; ``eventpipe console`` serves it alone."""

    host: str = "127.0.0.1"
    """Address to listen on. The console shows events as they arrived: keep it on the
    loopback, or behind a proxy that adds TLS."""
    port: int = Field(default=8002, ge=0, le=65535)
    """TCP port, apart from the collector's (0: any free port, printed at start-up)."""
    token: SecretStr | None = None
    """The admin token every page and API call needs: ``${EVENTPIPE_CONSOLE_TOKEN:-}``
    (from the environment: never written in the file, never logged). Absent or empty:
    no console. Never an event key."""
    sample_seconds: float = Field(default=5.0, gt=0, le=60)
    """How often the overview's figures are sampled for its charts (an hour kept)."""
    live_events_per_second: int = Field(default=20, ge=1, le=1000)
    """Events the live view shows per second at most; above it, a sample."""

    @field_validator("token", mode="before")
    @classmethod
    def _empty_is_none(cls, value: object) -> object:
        """``${EVENTPIPE_CONSOLE_TOKEN:-}``: the console is on where the variable is set."""
        return None if value == "" else value

    @field_validator("token")
    @classmethod
    def _long_enough(cls, value: SecretStr | None) -> SecretStr | None:
        if value is not None and len(value.get_secret_value()) < MIN_TOKEN_LENGTH:
            raise ValueError(
                f"token: at least {MIN_TOKEN_LENGTH} characters; make one with: "
                "openssl rand -hex 16"
            )
        return value

    @property
    def enabled(self) -> bool:
        return self.token is not None
