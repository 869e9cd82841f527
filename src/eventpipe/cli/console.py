"""``eventpipe console``: the web console alone (``eventpipe run`` starts one too)."""

from __future__ import annotations

from pathlib import Path

import click

from eventpipe.cli.common import cli, config_option, config_path_of, load
from eventpipe.errors import ConfigError


@cli.command()
@config_option
@click.option("--host", default=None, help="Override console.host.")
@click.option("--port", type=int, default=None, help="Override console.port.")
def console(config_path: Path | None, host: str | None, port: int | None) -> None:
    """Serve the web console: what arrives, where it went, what failed (docs/console.md).
    It reads the data directory and the state store; it needs console.token."""
    from eventpipe.console.app import serve

    config = load(config_path).config
    if not config.console.enabled:
        raise ConfigError(
            "the console needs an admin token: console.token is not set",
            fix="console: {token: ${EVENTPIPE_CONSOLE_TOKEN:-}} in eventpipe.yaml, and export "
            "EVENTPIPE_CONSOLE_TOKEN=$(openssl rand -hex 16)",
        )
    overrides = {k: v for k, v in (("host", host), ("port", port)) if v is not None}
    if overrides:
        config = config.model_copy(update={"console": config.console.model_copy(update=overrides)})
    serve(config, config_path_of(config_path))
