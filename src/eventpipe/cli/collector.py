"""Commands of the collector: ``init``, ``collect``, ``run`` (collector and pipeline),
``rotate``, ``import``."""

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
    js, server = "js." + secrets.token_urlsafe(18), "s2s." + secrets.token_urlsafe(18)
    text = text.replace("__JS_SECRET__", js).replace("__SERVER_SECRET__", server)
    write_file(target, text, private=True)  # it holds secrets
    # The keys go to the terminal, once, as the embedded defaults' do (never to a log).
    where = "" if target == DEFAULT_CONFIG_PATH else f" -c {target}"
    click.echo(f"wrote {target} (readable by you only: it holds the keys)")
    click.echo(f"  key web: browser {js}   server {server}")
    click.echo(f"next: `eventpipe run{where}` (or `make run`) starts the collector and the "
               "pipeline on 127.0.0.1:8001; then send an event:")  # fmt: skip
    click.echo("  curl -H 'Content-Type: application/json' -d '{\"event_type\": \"hello\"}' "
               f"'http://127.0.0.1:8001/api/v1/event?token={js}'")  # fmt: skip


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

    run(load(config_path), config_path_of(config_path))  # the pipeline's child reads it too


@cli.command()
@config_option
def rotate(config_path: Path | None) -> None:
    """Seal the active segments now (asks a running collector, or seals them itself)."""
    from eventpipe.log.recovery import rotate_now
    from eventpipe.log.settings import LogSettings

    config = load(config_path).config
    sealed = rotate_now(config.layout, LogSettings.of(config))
    if not sealed:
        click.echo("nothing to seal: no active segment has events")
    for path in sealed:
        click.echo(f"sealed {path}")


@cli.command("import")
@config_option
@click.argument("paths", nargs=-1, required=True,
                type=click.Path(exists=True, path_type=Path))  # fmt: skip
@click.option("--key", "key_id", required=True, help="The api key id the events are of.")
@click.option("--format", "fmt", type=click.Choice(["ndjson", "json", "csv"]), default=None,
              help="Instead of choosing by the file name.")  # fmt: skip
@click.option("--force", is_flag=True, help="Import files already imported (same SHA-256).")
def import_command(
    config_path: Path | None, paths: tuple[Path, ...], key_id: str, fmt: str | None, force: bool
) -> None:
    """Append events from files (NDJSON, JSON arrays, CSV; plain, .gz or .zst; files or
    directories) to the log, through the collector's checks; bad lines go to failed/.
    Importing a file twice adds nothing (docs/log.md, "Importing files")."""
    import sys

    from eventpipe.collector.imports import files_of, import_files
    from eventpipe.config import with_dev_keys

    loaded = load(config_path)
    config = loaded.config
    if loaded.embedded:  # the collector's development key pair: --key dev
        config, _ = with_dev_keys(config)
    files = files_of(list(paths))
    total = sum(f.stat().st_size for f in files)
    with click.progressbar(length=total, label="importing", file=sys.stderr,
                           show_pos=False) as bar:  # fmt: skip
        reports = import_files(config, list(paths), key_id, fmt=fmt, force=force,
                               progress=bar.update)  # fmt: skip
    for report in reports:
        if report.skipped:
            click.echo(f"{report.path}: skipped, {report.skipped} (--force imports it again)")
            continue
        rejected = sum(report.rejected.values())
        line = f"{report.path}: {report.events} events"
        if rejected:
            reasons = ", ".join(f"{n} {r}" for r, n in sorted(report.rejected.items()))
            line += f", {rejected} rejected ({reasons}; in {config.layout.failed})"
        if report.broken:
            line += (f", {report.broken} breaking their tracking plan (imported with the "
                     "verdict: each destination's on_violation decides)")  # fmt: skip
        click.echo(line)
    events = sum(r.events for r in reports)
    click.echo(f"imported {events} events from {len(reports)} file(s); "
               "the pipeline's next run loads them")  # fmt: skip
