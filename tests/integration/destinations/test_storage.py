"""The file operations of file destinations, on a local directory and through the Hadoop
FileSystem of a real Spark session (``file://`` URIs: the same code path as ``s3a://``
or ``hdfs://``, whose servers cannot run here)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from eventpipe.destinations.storage import HadoopStorage, LocalStorage, Storage, join


@pytest.fixture(params=["local", "hadoop"])
def storage(request: pytest.FixtureRequest, tmp_path: Path) -> Storage:
    if request.param == "local":
        return LocalStorage(tmp_path / "root")
    spark: Any = request.getfixturevalue("spark")
    return HadoopStorage(spark, (tmp_path / "root").as_uri())


def test_text_files_are_created_whole_and_read_back(storage: Storage) -> None:
    path = join(storage.root, "t", "_meta", "a.json")
    assert storage.read_text(path) is None
    storage.create_text(path, '{"é": 1}')
    assert storage.read_text(path) == '{"é": 1}'
    # Nothing but the file itself is visible: the partial copy was renamed into place.
    assert [n for n in storage.names(join(storage.root, "t", "_meta")) if "partial" in n] == []
    assert "a.json" in storage.names(join(storage.root, "t", "_meta"))


def test_files_lists_below_a_directory_relative_to_it(storage: Storage) -> None:
    for name in ("t/day=1/part-a-0.parquet", "t/day=2/part-a-1.parquet", "t/x.json"):
        storage.create_text(join(storage.root, name), "x")
    assert storage.files(join(storage.root, "t"), ".parquet") == [
        "day=1/part-a-0.parquet", "day=2/part-a-1.parquet"
    ]  # fmt: skip
    assert storage.files(join(storage.root, "missing"), ".parquet") == []
    assert storage.names(join(storage.root, "missing")) == []


def test_move_creates_the_target_directory_and_delete_removes_trees(storage: Storage) -> None:
    source = join(storage.root, ".staging", "b", "day=1", "f.parquet")
    storage.create_text(source, "rows")
    target = join(storage.root, "t", "day=1", "part-k-0.parquet")
    storage.move(source, target)
    assert storage.read_text(target) == "rows"
    assert storage.read_text(source) is None
    storage.delete(join(storage.root, ".staging"))
    assert ".staging" not in storage.names(storage.root)
    storage.delete(join(storage.root, "never-there"))  # nothing to do, no error
