"""Durable files: a file is the old one or the whole new one, never a part."""

from __future__ import annotations

from pathlib import Path

import pytest

from eventpipe.files import KeepOld, append_file, move, replacing, write_file


def test_a_file_is_written_whole_and_no_temporary_file_stays(tmp_path: Path) -> None:
    target = tmp_path / "d" / "f.json"
    write_file(target, "{}")
    write_file(target, b"[1]")
    assert target.read_bytes() == b"[1]"
    assert sorted(p.name for p in target.parent.iterdir()) == ["f.json"]


def test_a_block_that_raises_leaves_the_old_file(tmp_path: Path) -> None:
    target = tmp_path / "f.log"
    write_file(target, "old\n")

    def dying() -> None:
        with replacing(target) as out:
            out.write(b"new, half")
            raise RuntimeError("died")

    with pytest.raises(RuntimeError):
        dying()
    assert target.read_text() == "old\n"
    assert [p.name for p in tmp_path.iterdir()] == ["f.log"]


def test_keep_old_drops_what_was_written(tmp_path: Path) -> None:
    target = tmp_path / "f.log"
    write_file(target, "old\n")
    with replacing(target) as out:
        out.write(b"the same\n")
        raise KeepOld
    assert target.read_text() == "old\n"
    assert [p.name for p in tmp_path.iterdir()] == ["f.log"]


def test_appends_and_moves(tmp_path: Path) -> None:
    log = tmp_path / "a" / "x.log"
    append_file(log, b"1\n")
    append_file(log, b"2\n")
    move(log, tmp_path / "b" / "y.log")
    assert (tmp_path / "b" / "y.log").read_bytes() == b"1\n2\n"
    assert not log.exists()
