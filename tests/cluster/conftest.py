"""The standalone cluster of this directory's tests (tests/standalone.py): a master and
two one-core workers, each in a mount namespace of its own whose ``/tmp`` is empty. The
jobs are run as a user would, by ``eventpipe`` commands in processes of their own, since
this test process's Spark session is a local one.

If ``unshare`` cannot make the namespaces (it needs root or CAP_SYS_ADMIN), the tests
fail saying so.
"""

from __future__ import annotations

import shutil
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import TEST_JVM_OPTIONS
from tests.standalone import Cluster, standalone_cluster


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    logs = tmp_path_factory.mktemp("cluster-logs")
    with standalone_cluster(logs, executor_java_options=TEST_JVM_OPTIONS) as found:
        yield found


@pytest.fixture
def shared_dir() -> Iterator[Path]:
    """A directory every node sees (``/var/tmp``, outside the workers' own ``/tmp``)."""
    path = Path("/var/tmp") / f"eventpipe-cluster-{uuid.uuid4().hex[:10]}"
    path.mkdir()
    yield path
    shutil.rmtree(path, ignore_errors=True)
