"""A pipeline's runtime: what every run over one data directory is run with. An entry
point (``eventpipe process``, a command of the CLI, an Airflow task, the public
functions of ``processing/``) builds one and passes it down; nothing below it opens the
state store again or narrows the config on its own."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from functools import cached_property
from typing import TYPE_CHECKING

from eventpipe.config import Config
from eventpipe.errors import TransientError
from eventpipe.locks import Locks
from eventpipe.state.locks import open_locks
from eventpipe.state.store import StateStore, open_state

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from eventpipe.destinations.base import Opened


class PipelineBusyError(TransientError):
    """Another pipeline process is working on this data directory."""

    name = "pipeline_busy"


class Runtime:
    """The config, the state store (opened once, on first use), the data directory's
    locks and the Spark session (given, or started by ``spark``'s factory when first
    asked for: a run with nothing to do starts no JVM).

    ``pause`` is how the job waits between attempts (a stream's raises when the stream
    is stopping). ``only(ids)`` is the same runtime for some destinations: the config
    narrowed once, the rest shared."""

    def __init__(
        self,
        config: Config,
        spark: SparkSession | Callable[[], SparkSession] | None = None,
        *,
        pause: Callable[[float], None] = time.sleep,
        state: StateStore | None = None,
    ) -> None:
        self.config = config
        self.pause = pause
        self._spark = spark
        if state is not None:
            self.__dict__["state"] = state  # cached_property's slot: shared, not reopened

    @cached_property
    def state(self) -> StateStore:
        """The state store ``config`` names, opened once for the runtime."""
        return open_state(self.config)

    @cached_property
    def locks(self) -> Locks:
        """The data directory's locks (eventpipe.state.locks)."""
        return open_locks(self.config)

    @property
    def spark(self) -> SparkSession:
        """The session: the one given, or started now (``config.spark``'s settings)."""
        if self._spark is None:
            from eventpipe.processing.runtime.spark import start_session

            self._spark = start_session(self.config.spark.settings)
        elif callable(self._spark):
            self._spark = self._spark()
        return self._spark

    def only(self, dest_ids: Iterable[str]) -> Runtime:
        """The same runtime for the destinations ``dest_ids`` alone."""
        wanted = list(dict.fromkeys(dest_ids))
        if list(self.config.destinations) == wanted:
            return self
        destinations = {d: self.config.destinations[d] for d in wanted}
        narrowed = self.config.model_copy(update={"destinations": destinations})
        twin = Runtime(narrowed, self._spark_factory(), pause=self.pause, state=self.state)
        twin.__dict__["locks"] = self.locks
        return twin

    def _spark_factory(self) -> SparkSession | Callable[[], SparkSession]:
        """The session itself once started; else a factory that starts it here once."""
        if self._spark is not None and not callable(self._spark):
            return self._spark
        return lambda: self.spark

    @contextmanager
    def pipeline_lock(self) -> Iterator[None]:
        """One pipeline per data directory: two would plan runs over the same segments.
        Held across hosts (eventpipe.state.locks)."""

        def busy(holder: str) -> Exception:
            return PipelineBusyError(
                f"another pipeline ({holder}) is processing {self.config.layout.root}",
                fix="wait for it, or stop it (eventpipe run includes one)",
            )

        with self.locks.holding("pipeline", busy):
            yield

    def open_destination(self, dest_id: str) -> Opened:
        """The destination ``dest_id`` of the config, opened (destinations/registry.py);
        one written by Spark gets the runtime's session."""
        from eventpipe.destinations import registry

        lent = registry.Resources(locks=self.locks, spark=lambda: self.spark)
        return registry.open_destination(dest_id, self.config.destinations[dest_id],
                                         self.config, lent)  # fmt: skip


@contextmanager
def pipeline_lock(config: Config) -> Iterator[None]:
    """Runtime.pipeline_lock for a config alone (tests, the archive's own step)."""
    with Runtime(config).pipeline_lock():
        yield
