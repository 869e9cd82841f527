"""The archive's copy on S3 (``archive.remote``, moto's server: tests/s3.py): each run
uploads what it archived; `archive restore` brings a lost disk back byte for byte and
`archive cat` a day the disk no longer has; `archive verify --remote` names a damaged
object, which restore refuses; a store that fails leaves the day pending, and max_bytes
never deletes a day that is nowhere else; retention deletes from both copies."""

from __future__ import annotations

import shutil
from datetime import date
from pathlib import Path
from typing import Any

import orjson
import yaml

from eventpipe.archive.files import ArchivedSegment, Index, segments_of_day
from eventpipe.archive.remote import pending, remote_of
from eventpipe.archive.retention import prune, pruned_through
from eventpipe.archive.write import archive_segment
from eventpipe.config import ArchiveConfig, Config
from eventpipe.processing.batch.archiving import upload_archived
from tests.conftest import make_config
from tests.process import free_port, run, write_config

SEGMENTS = (
    "incoming.tok=web-2026-11-20T10-00-00.000.log",
    "incoming.tok=web-2026-11-20T11-00-00.000.log",
    "incoming.tok=web-2026-11-21T09-00-00.000.log",
)


def _archive(config: Config) -> tuple[list[Path], list[bytes]]:
    """Three segments of 200 events archived on disk (two days); the .lz4 files, and
    the events in log order."""
    layout = config.layout
    layout.incoming.mkdir(parents=True, exist_ok=True)
    events = [orjson.dumps({"n": n, "eventn_ctx": {"event_id": f"ev-{n}"}}) + b"\n"
              for n in range(600)]  # fmt: skip
    archived = []
    for part, name in enumerate(SEGMENTS):
        (layout.incoming / name).write_bytes(b"".join(events[part * 200 : (part + 1) * 200]))
        archived.append(archive_segment(layout, name, config.archive))
    return archived, events


def _config(tmp_path: Path, s3: dict[str, str], bucket: str, **archive: Any) -> Config:
    settings = {"remote": f"s3://{bucket}/archive", "s3": s3, "frame_events": 50, **archive}
    return make_config(tmp_path / "data", archive=settings)


def _config_file(tmp_path: Path, config: Config) -> Path:
    path = write_config(tmp_path / "eventpipe.yaml", config.layout.root, free_port())
    data = yaml.safe_load(path.read_text())
    data["archive"] = config.archive.model_dump(exclude_none=True)
    path.write_text(yaml.safe_dump(data))
    return path


def _files(archive: Path) -> dict[str, bytes]:
    return {str(p.relative_to(archive)): p.read_bytes()
            for p in sorted(archive.rglob("*")) if p.is_file()}  # fmt: skip


def test_a_run_uploads_what_it_archived_and_restore_brings_a_lost_disk_back(
    tmp_path: Path, s3_server: Any, s3_bucket: str
) -> None:
    config = _config(tmp_path, s3_server.settings(), s3_bucket)
    archived, events = _archive(config)
    upload_archived(config, archived)
    keys = s3_server.keys(s3_bucket, "archive/")
    assert len(keys) == 12  # three segments, four files each
    assert "archive/2026-11-21/" + SEGMENTS[2] + ".lz4.manifest.json" in keys
    assert pending(config.layout) == []
    upload_archived(config, [])  # nothing new: nothing sent again
    before = _files(config.layout.archive)
    shutil.rmtree(config.layout.archive)  # the disk is lost
    config_file = _config_file(tmp_path, config)
    restored = run("archive", "restore", "-c", str(config_file))
    assert restored.returncode == 0, restored.stderr
    assert restored.stdout.strip().endswith(f"3 segment(s) restored from s3://{s3_bucket}/archive")
    assert _files(config.layout.archive) == before  # byte for byte
    verified = run("archive", "verify", "--remote", "-c", str(config_file))
    assert verified.returncode == 0, verified.stderr
    assert verified.stdout.strip() == "ok: 2 day(s), 3 file(s), 12 frame(s), 600 event(s), 0.0 MB"
    # A day the disk no longer has: `archive cat` reads it from the copy.
    shutil.rmtree(config.layout.archive / "2026-11-20")
    day = run("archive", "cat", "--day", "2026-11-20", "-c", str(config_file))
    assert day.returncode == 0, day.stderr
    assert day.stdout.encode() == b"".join(events[:400])
    # Compaction's replaced segments leave the copy too.
    remote = remote_of(config.archive)
    assert remote is not None
    remote.forget([ArchivedSegment(archived[0])])
    left = [k for k in s3_server.keys(s3_bucket, "archive/2026-11-20/") if not k.endswith("/")]
    assert len(left) == 4  # (pyarrow leaves a directory's marker when it empties one)


def test_verify_remote_names_a_damaged_object_and_restore_refuses_it(
    tmp_path: Path, s3_server: Any, s3_bucket: str
) -> None:
    config = _config(tmp_path, s3_server.settings(), s3_bucket)
    archived, _ = _archive(config)
    upload_archived(config, archived)
    data = archived[1]
    frame = Index.read(data.with_name(data.name + ".index.json")).frames[2]
    damaged = bytearray(data.read_bytes())
    damaged[frame.offset + 30] ^= 0x01
    key = f"archive/2026-11-20/{data.name}"
    s3_server.client().put_object(Bucket=s3_bucket, Key=key, Body=bytes(damaged))
    config_file = _config_file(tmp_path, config)
    bad = run("archive", "verify", "--remote", "-c", str(config_file))
    assert bad.returncode == 65
    assert f"MISMATCH 2026-11-20/{data.name}: frame 2 (bytes {frame.offset}+" in bad.stdout
    ok = run("archive", "verify", "-c", str(config_file))  # the disk's copy is fine
    assert ok.returncode == 0, ok.stdout
    for path in (data, *ArchivedSegment(data).sidecars):
        path.unlink()
    refused = run("archive", "restore", "-c", str(config_file))
    assert refused.returncode == 65
    assert f"{data.name} on the remote does not match its manifest" in refused.stderr
    assert not data.exists()  # nothing damaged took its place
    assert not list(config.layout.tmp.glob("archive-restore-*"))


def test_a_store_that_fails_leaves_the_day_pending_and_max_bytes_keeps_it(
    tmp_path: Path, s3_server: Any, s3_bucket: str
) -> None:
    closed = {**s3_server.settings(), "endpoint": f"http://127.0.0.1:{free_port()}"}
    down = _config(tmp_path, closed, s3_bucket, max_bytes=1)
    archived, _ = _archive(down)
    upload_archived(down, archived)  # the store fails: the run goes on
    assert pending(down.layout) == ["2026-11-20", "2026-11-21"]
    status = run("status", "-c", str(_config_file(tmp_path, down)))
    assert status.returncode == 0, status.stderr
    assert f"copied to s3://{s3_bucket}/archive (2 day(s) waiting to upload)" in status.stdout
    remote_down = remote_of(down.archive)
    prune(down.layout, None, max_bytes=1, remote=remote_down)
    assert sorted(d.name for d in down.layout.archive.iterdir() if d.is_dir()) == [
        "2026-11-20", "2026-11-21"]  # fmt: skip  # their only copy: kept
    up = _config(tmp_path, s3_server.settings(), s3_bucket, max_bytes=1)
    upload_archived(up, [])  # the next run: the pending days go up
    assert pending(up.layout) == []
    assert len(s3_server.keys(s3_bucket, "archive/")) == 12
    remote = remote_of(up.archive)
    assert [p.name for p in prune(up.layout, None, max_bytes=1, remote=remote)] == ["2026-11-20"]
    assert pruned_through(up.layout) is None  # the copy keeps it: reprocess may read it
    assert remote is not None
    assert remote.days() == ["2026-11-20", "2026-11-21"]
    # Retention deletes from both copies, and then the days are gone for reprocess.
    prune(up.layout, 3, remote=remote, today=date(2026, 11, 24))
    assert remote.days() == ["2026-11-21"]
    assert pruned_through(up.layout) == "2026-11-20"
    assert list(segments_of_day(up.layout.archive / "2026-11-21"))


def test_archive_remote_is_an_s3_prefix_with_its_s3_keys() -> None:
    import pytest
    from pydantic import ValidationError

    settings = ArchiveConfig(remote="s3://bucket/archive/", s3={"region": "eu-west-1"})
    assert settings.remote == "s3://bucket/archive/"
    with pytest.raises(ValidationError, match="write s3://bucket/prefix"):
        ArchiveConfig(remote="/mnt/backup")
    with pytest.raises(ValidationError, match="there is none"):
        ArchiveConfig(s3={"region": "eu-west-1"})
