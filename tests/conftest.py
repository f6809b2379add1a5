"""Fixtures shared by the test modules that drive a Store in-process, and the marker of each kind of test.

Every test is ``unit`` (it starts no process and opens no socket) or ``process`` (real daemons, front-ends,
command lines), by the directory it lives in: ``tests/unit/`` or ``tests/process/``. A test that is the
other kind than its module's neighbours carries that marker itself and keeps it. ``pytest -m unit`` runs
the quick ones.
"""
from __future__ import annotations

from pathlib import Path

import pytest

from storaged.store import Store

KINDS = ("unit", "process")
_HERE = Path(__file__).resolve().parent


@pytest.hookimpl(tryfirst=True)  # before ``-m`` deselects by marker
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if any(item.get_closest_marker(kind) for kind in KINDS):
            continue
        try:
            kind = Path(item.path).resolve().relative_to(_HERE).parts[0]
        except ValueError:
            continue
        if kind in KINDS:
            item.add_marker(kind)


@pytest.fixture
def store(tmp_path):
    """A fresh store in a temporary data directory, closed afterwards."""
    s = Store.open(str(tmp_path / "data"))
    yield s
    s.close()
