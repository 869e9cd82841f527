"""The ``eventpipe`` command: one subcommand per verb, each thin (parse, call, print).

Every command takes ``-c/--config FILE`` (before or after its name, or
``EVENTPIPE_CONFIG``; default ``./eventpipe.yaml``; built-in embedded defaults when that
file does not exist). Errors print as ``error: ...`` with the fix, and exit with the
error's code (docs/orchestration.md): 0 done, 2 configuration, 65 data a retry will not
fix, 75 transient (retry), 1 anything else; ``--idle-exit-code`` gives the code of a
command that had nothing to do (99: Airflow's skip).
"""

from __future__ import annotations

import sys

import click

# Each module registers its commands on the group.
from eventpipe.cli import (  # noqa: F401
    archive,
    collector,
    console,
    contract,
    lake,
    log,
    pipeline,
    sources,
    status,
)
from eventpipe.cli.common import cli
from eventpipe.errors import EventpipeError

__all__ = ["cli", "main"]


def main() -> None:
    try:
        # Outside standalone mode click returns the code of a click.exceptions.Exit
        # (--idle-exit-code) instead of exiting with it.
        code = cli.main(standalone_mode=False)
        if isinstance(code, int) and code:
            sys.exit(code)
    except click.exceptions.Abort:
        sys.exit(130)
    except click.ClickException as exc:
        exc.show()
        sys.exit(exc.exit_code)
    except EventpipeError as exc:
        click.echo(f"error: {exc.message}", err=True)
        if exc.fix:
            click.echo(f"  fix: {exc.fix}", err=True)
        sys.exit(exc.exit_code)
    except KeyboardInterrupt:
        sys.exit(130)
