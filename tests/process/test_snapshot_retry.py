"""A background snapshot whose child keeps failing is tried again after a backoff (server.SNAPSHOT_RETRY_S,
doubled each time up to SNAPSHOT_RETRY_MAX_S), not forked again at every turn of the loop: a store due a
base (row segments of an earlier version) forked ~10 failing children a second; the daemon serves
meanwhile."""
from __future__ import annotations

import time
from pathlib import Path

import pytest

from tests.support.daemon_proc import Daemon
from tests.support.release_store import STORE_ROWS2, copy_store

pytestmark = pytest.mark.timeout(120)

FAILED = "background snapshot child failed"


def test_a_failing_snapshot_child_is_retried_after_a_backoff(tmp_path, monkeypatch):
    monkeypatch.setenv("CONVMEM_FAULT_SNAPSHOT_DELAY_S", "fail")   # (children.start: the child exits 1 at once)
    data = tmp_path / "data"
    copy_store(STORE_ROWS2, Path(data))   # due a base from its start, whatever is written
    d = Daemon(data)
    with d:
        d.start()
        with d.client(timeout_ms=60_000) as c:
            deadline = time.monotonic() + 30
            while FAILED not in d.stderr():
                assert time.monotonic() < deadline, d.stderr()[-2000:]
                c.call("ping", {})
                time.sleep(0.05)
            first = time.monotonic()
            while time.monotonic() - first < 4.0:   # the loop turns ~40 times meanwhile
                assert "pid" in c.call("ping", {})
                time.sleep(0.1)
            failed = d.stderr().count(FAILED)
            assert 2 <= failed <= 4, failed   # at 0, 1, 3 s (and 7: not yet)
            assert "2 failed in a row, the next one in 2 s" in d.stderr()
