"""bench.rows_heap (the rows a daemon holds on its heap after deletes and a rebuild) runs end to end on a
store big enough for its base to be mapped, and says what it measured: it checks that the command works
and that the rebuild's base took the rows' place, never how much memory that saved."""
from __future__ import annotations

import pytest

from bench import rows_heap
from tests.process.test_release_idle import N, _import
from tests.support.daemon_proc import Daemon

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]


def test_rows_heap_measures_each_point_and_the_rebuilt_base_is_mapped(tmp_path):
    src = tmp_path / "data"
    with Daemon(src) as d:
        d.start()
        with d.client(timeout_ms=60_000) as c:
            _import(c, N)
    res = rows_heap.run(str(src), str(tmp_path / "work"), prefix=0.05, rest_s=0.5, map_wait_s=120)
    assert res["deleted_messages"] == int(N * 0.05)   # (the one in the middle among them)
    for point in ("start", "deleted", "rebuilt", "restarted"):
        assert res[point]["RssAnon"] > 0 and res[point]["VmRSS"] >= res[point]["RssAnon"], point
    assert res["rebuild"]["messages_indexed"] == N - res["deleted_messages"]
    assert res["rebuilt_base_mapped"] is True
