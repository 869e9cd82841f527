"""Commands of the collector: ``init``, ``collect``, ``run`` (collector and pipeline),
``rotate``."""

from __future__ import annotations

import secrets
from importlib import resources
from pathlib import Path

import click

from eventpipe.cli.common import cli, config_option, config_path_of, load
from eventpipe.config import DEFAULT_CONFIG_PATH
from eventpipe.errors import ConfigError
from eventpipe.files import write_file


@cli.command()
@config_option
@click.option("--force", is_flag=True, help="Overwrite an existing file.")
def init(config_path: Path | None, force: bool) -> None:
    """Write a commented reference eventpipe.yaml with fresh random keys."""
    target = config_path_of(config_path) or DEFAULT_CONFIG_PATH
    if target.exists() and not force:
        raise ConfigError(f"{target} already exists", fix="pass --force to overwrite it")
    text = resources.files("eventpipe").joinpath("reference.yaml").read_text(encoding="utf-8")
    text = text.replace("__JS_SECRET__", "js." + secrets.token_urlsafe(18))
    text = text.replace("__SERVER_SECRET__", "s2s." + secrets.token_urlsafe(18))
    write_file(target, text, private=True)  # it holds secrets
    click.echo(f"wrote {target}; edit it, then run `eventpipe collect -c {target}`")


@cli.command()
@config_option
@click.option("--host", default=None, help="Override server.host.")
@click.option("--port", type=int, default=None, help="Override server.port.")
def collect(config_path: Path | None, host: str | None, port: int | None) -> None:
    """Run the HTTP collector alone (scale it out on many nodes)."""
    from eventpipe import service

    loaded = load(config_path)
    overrides = {k: v for k, v in (("host", host), ("port", port)) if v is not None}
    if overrides:
        server = loaded.config.server.model_copy(update=overrides)
        loaded = loaded.model_copy(
            update={"config": loaded.config.model_copy(update={"server": server})}
        )
    service.collect(loaded)


@cli.command("run")
@config_option
def run_command(config_path: Path | None) -> None:
    """Collector and batch pipeline together, supervised; Ctrl-C stops both cleanly."""
    from eventpipe.service import run

    run(load(config_path), config_path)


@cli.command()
@config_option
def rotate(config_path: Path | None) -> None:
    """Seal the active segments now (asks a running collector, or seals them itself)."""
    from eventpipe.log.recovery import rotate_now
    from eventpipe.log.segments import LogSettings

    config = load(config_path).config
    sealed = rotate_now(config.layout, LogSettings.of(config))
    if not sealed:
        click.echo("nothing to seal: no active segment has events")
    for path in sealed:
        click.echo(f"sealed {path}")
