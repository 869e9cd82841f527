"""The ``eventpipe`` command: one subcommand per verb, each thin (parse, call, print).

Every command takes ``-c/--config FILE`` (before or after its name, or
``EVENTPIPE_CONFIG``; default ``./eventpipe.yaml``; built-in embedded defaults when that
file does not exist). Errors print as ``error: ...`` with the fix, and exit with 2 for
configuration errors, 1 for the rest.
"""

from __future__ import annotations

import sys

import click

# Each module registers its commands on the group.
from eventpipe.cli import archive, collector, lake, log, pipeline, sources, status  # noqa: F401
from eventpipe.cli.common import cli
from eventpipe.errors import ConfigError, EventpipeError

__all__ = ["cli", "main"]


def main() -> None:
    try:
        cli.main(standalone_mode=False)
    except click.exceptions.Abort:
        sys.exit(130)
    except click.ClickException as exc:
        exc.show()
        sys.exit(exc.exit_code)
    except EventpipeError as exc:
        click.echo(f"error: {exc.message}", err=True)
        if exc.fix:
            click.echo(f"  fix: {exc.fix}", err=True)
        sys.exit(2 if isinstance(exc, ConfigError) else 1)
    except KeyboardInterrupt:
        sys.exit(130)
