"""Fixtures shared by the test modules that drive a Store in-process."""
from __future__ import annotations

import pytest

from storaged.store import Store


@pytest.fixture
def store(tmp_path):
    """A fresh store in a temporary data directory, closed afterwards."""
    s = Store.open(str(tmp_path / "data"))
    yield s
    s.close()
