"""The JVM class-data archive (processing/runtime/class_data.py): built by the setup (``make test``
runs ``eventpipe spark-archive``), and mapped by the driver JVM of a cold ``process
--once``. Spark's own ``-Xshare:on`` makes the JVM refuse to start when the archive it
is given cannot be mapped, so a run that loads its rows proves the archive was used;
the same run with a broken archive in its place fails."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import yaml

from eventpipe.processing.modes import training
from eventpipe.processing.runtime import class_data
from tests.process import run


def test_with_archive_comes_after_the_configured_java_options(tmp_path: Path) -> None:
    archive = tmp_path / "spark.jsa"
    settings = {class_data.JAVA_OPTIONS: "-Dx=1", "spark.master": "local[1]"}
    assert class_data.with_archive(settings, archive) == settings  # none built: unchanged
    archive.write_bytes(b"built")
    assert class_data.with_archive(settings, archive)[class_data.JAVA_OPTIONS] == (
        f"-Dx=1 -XX:SharedArchiveFile={archive}"
    )
    assert class_data.with_archive({}, archive) == {
        class_data.JAVA_OPTIONS: f"-XX:SharedArchiveFile={archive}"
    }


def test_the_archive_is_named_by_this_java_and_this_spark(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("EVENTPIPE_CACHE_DIR", str(tmp_path))
    path = class_data.archive_path()
    assert path is not None
    assert path.parent == tmp_path
    import pyspark

    assert path.name.startswith(f"spark-{pyspark.__version__}-")
    assert path.suffix == ".jsa"


def test_spark_installed_again_names_another_archive_and_its_build_prunes_the_old(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A new virtualenv at the same path: same Spark, jars written again. The JVM refuses
    # an archive whose jars changed, so the old archive must not be found for them.
    import pyspark

    home = tmp_path / "site-packages" / "pyspark"
    (home / "jars").mkdir(parents=True)
    (home / "__init__.py").write_text("")
    jar = home / "jars" / "spark-core.jar"
    jar.write_bytes(b"classes")
    os.utime(jar, ns=(1_000_000_000, 1_000_000_000))
    monkeypatch.setattr(pyspark, "__file__", str(home / "__init__.py"))
    monkeypatch.setenv("EVENTPIPE_CACHE_DIR", str(tmp_path / "cache"))
    first = class_data.archive_path()
    assert first == class_data.archive_path()  # the same jars: the same archive
    os.utime(jar, ns=(2_000_000_000, 2_000_000_000))
    again = class_data.archive_path()
    assert first is not None
    assert again is not None
    assert again != first
    assert again.name.rsplit("-", 1)[0] == first.name.rsplit("-", 1)[0]  # one installation

    first.parent.mkdir()
    first.write_bytes(b"stale")
    other = first.parent / "spark-0.0.0-0000000000000000-0000000000000000.jsa"
    other.write_bytes(b"another installation's")
    again.write_bytes(b"built")
    class_data.prune_stale(again)
    assert not first.exists()
    assert again.exists()
    assert other.exists()


def test_a_cache_directory_it_cannot_write_is_a_clear_error_before_any_training(
    tmp_path: Path,
) -> None:
    read_only = tmp_path / "not-a-directory"
    read_only.write_text("a file where the cache directory would be")
    with pytest.raises(class_data.ClassDataError) as info:
        training.build(read_only / "spark.jsa")
    assert "EVENTPIPE_CACHE_DIR" in str(info.value.fix)


def _built() -> Path:
    path = class_data.archive_path()
    assert path is not None, "no Java"
    assert path.is_file(), f"no class-data archive at {path}: `make test` builds it"
    return path


def test_the_setup_built_it_and_says_so_when_asked_again() -> None:
    path = _built()
    again = run("spark-archive")
    assert again.returncode == 0, again.stderr
    assert again.stdout.strip() == f"up to date: {path}"


def _three_events(tmp_path: Path, name: str) -> Path:
    data = tmp_path / name
    incoming = data / "incoming"
    incoming.mkdir(parents=True)
    (incoming / "incoming.tok=web-2026-11-24T10-00-00.000.log").write_text(
        "".join(f'{{"event_type": "view", "api_key": "web", "n": {n}}}\n' for n in range(3))
    )
    config = tmp_path / f"{name}.yaml"
    config.write_text(yaml.safe_dump({
        "data_dir": str(data),
        "destinations": {"warehouse": {"type": "duckdb", "path": str(tmp_path / f"{name}.duckdb")}},
        # Strict: the JVM does not start unless it maps the archive it is given.
        "spark": {"master": "local[1]", "spark.driver.extraJavaOptions": "-Xshare:on"},
    }))  # fmt: skip
    return config


@pytest.mark.slow
def test_a_cold_process_maps_the_archive_and_a_broken_one_stops_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _built()
    mapped = run("process", "--once", "-c", str(_three_events(tmp_path, "mapped")), timeout=180)
    assert mapped.returncode == 0, mapped.stdout + mapped.stderr
    assert "warehouse.events: 3 rows" in mapped.stdout
    # An embedded driver binds the loopback address: no warning a user can do nothing about.
    assert "resolves to a loopback address" not in mapped.stdout + mapped.stderr

    # The same run, with garbage where its archive is looked for: the JVM refuses.
    broken = tmp_path / "cache"
    broken.mkdir()
    monkeypatch.setenv("EVENTPIPE_CACHE_DIR", str(broken))
    garbage = class_data.archive_path()
    assert garbage is not None
    garbage.write_bytes(b"not a class-data archive" * 100)
    refused = run("process", "--once", "-c", str(_three_events(tmp_path, "broken")), timeout=180)
    assert refused.returncode != 0
    assert "shared archive" in refused.stdout + refused.stderr
