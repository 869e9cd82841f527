"""Spark's Python daemon, with what eventpipe's tasks import already imported.

Spark starts one daemon per executor (``python -m <spark.python.daemon.module>``) and
forks a Python worker from it for each task slot; an idle worker is stopped after a
minute and the next task forks another. PySpark's own daemon imports nothing before it
forks, so every new worker imported PySpark's worker, pyarrow, pandas and the eventpipe
module of its function again: about 2.5 s of CPU before its first row (measured with
``bench/small_runs.py``), in each short ``process --once``, after each idle minute of a
service, and twice over in local mode with two task slots.

This daemon imports them once, then runs PySpark's: each worker forked from it starts
with them in memory (copy-on-write). It also imports PySpark from the interpreter's
installed package where Spark's copy on the path is that package's own
(``pyspark/python/lib/pyspark.zip`` inside pip's pyspark, as eventpipe installs it): a
zip holds no compiled bytecode, so each daemon compiled PySpark's sources again (1.3 s
of CPU), and Python 3.11 reads a zip's whole index again for each package imported from
it whenever a task calls ``importlib.invalidate_caches()``, as each new worker does
(0.2 s).

Forking after these imports is safe: pyarrow starts jemalloc's background thread when it
is imported, and jemalloc's own fork handlers leave the child consistent without it;
Arrow's thread pools are made again in a child (Arrow's fork handlers). Nothing else
imported here starts a thread.

It is eventpipe's default (``spark.python.daemon.module`` in runtime/spark.py); a
cluster's executors run it when eventpipe is installed on them, as its tasks need
anyway. Setting ``spark.python.daemon.module: pyspark.daemon`` in ``spark:`` goes back
to PySpark's.
"""

from __future__ import annotations

import importlib
import importlib.machinery
import sys
from pathlib import Path

PRELOADED = (
    "pyspark.worker",
    "pyarrow",
    "pandas",
    "pyspark.sql.pandas.serializers",
    "eventpipe.processing.steps.lookup",
    "eventpipe.processing.steps.transforms",
    "eventpipe.destinations.base",
    "eventpipe.archive.spark",
)
"""PySpark's worker and its Arrow serializers, and the modules whose functions
eventpipe's tasks run (their imports bring the destinations' and the lookups' own)."""


def preload() -> None:
    """Imports :data:`PRELOADED`; one that cannot be imported is left to the worker,
    which then fails with the import's own error where the task needs it."""
    for name in PRELOADED:
        try:
            importlib.import_module(name)
        except Exception:  # noqa: BLE001 - the worker reports it, in its task
            continue


def installed_pyspark_first() -> None:
    """Takes Spark's zips of PySpark and py4j off ``sys.path`` where they lie inside the
    PySpark package that the interpreter has installed: the same code, importable with
    its bytecode. A zip from anywhere else (a cluster's own Spark) stays."""
    zips = [p for p in sys.path if p.endswith(".zip")]
    rest = [p for p in sys.path if not p.endswith(".zip")]
    spec = importlib.machinery.PathFinder.find_spec("pyspark", rest)
    if not zips or spec is None or not spec.submodule_search_locations:
        return
    package = Path(next(iter(spec.submodule_search_locations))).resolve()
    own = {p for p in zips if Path(p).resolve().is_relative_to(package)}
    sys.path[:] = [p for p in sys.path if p not in own]


def main() -> None:
    installed_pyspark_first()
    preload()
    from pyspark import daemon

    daemon.manager()


if __name__ == "__main__":
    main()
