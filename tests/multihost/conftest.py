"""The multi-host cluster of tests/multihost (hostcluster.py) as a module fixture: skipped,
with the reason, where namespaces cannot be made (not root) or etcd or the PostgreSQL
server is missing; every process and namespace is removed at the end, also when a test
fails."""

from __future__ import annotations

from collections.abc import Iterator

import hostcluster
import pytest
from hostcluster import MultiHost


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MultiHost]:
    why = hostcluster.missing()
    if why:
        pytest.skip(why)
    with hostcluster.running(tmp_path_factory.mktemp("multihost")) as c:
        yield c
