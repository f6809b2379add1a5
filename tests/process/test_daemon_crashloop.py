"""The crash loop: concurrent writers through the real protocol while the daemon is SIGKILLed at
random moments and restarted, again and again. Every acknowledged write, update and delete must be
there at the end, exactly once; nothing unacknowledged may appear twice.

Each writer has its own REQ socket and retries a request that timed out on a new socket with the
same request id (Lazy Pirate), so a write applied just before a kill is answered with its first
result instead of being stored twice. The engine is ``bench.crash_loop.crash_loop``, the one behind
``python -m bench.crash_loop`` (which must run without ``tests/``)."""
from __future__ import annotations

import pytest

from bench.crash_loop import crash_loop


def _check(r: dict) -> None:
    print(f"\ncrash loop: kills={r['kills']} acknowledged={r['acknowledged']} "
          f"updates={r['acknowledged_updates']} deletes={r['acknowledged_deletes']} lost={r['lost']} "
          f"duplicated={r['duplicated']} retries={r['retries']} restart_mean={r['restart_s_mean']}s "
          f"restart_max={r['restart_s_max']}s in {r['seconds']}s")
    assert r["errors"] == [], r["errors"]
    assert r["lost"] == 0, r
    assert r["duplicated"] == 0, r
    assert r["stored_messages"] == r["expected_messages"] == r["health_active_messages"], r
    assert r["health_status"] == "OK", r
    # The loop really exercised something.
    assert r["acknowledged"] > 20 * r["kills"] // 10
    assert r["acknowledged_updates"] > 0 and r["acknowledged_deletes"] > 0
    assert r["retries"] > 0


@pytest.mark.timeout(300)
def test_crash_loop_30_kills(tmp_path):
    """The default run's crash loop: 30 kills at random moments under four writers, every check of the
    long loops. Each kill costs a restart (~0.7 s on 2 cores) and repeats what the others tested, so
    the runs of hundreds of kills (below) are ``-m slow``."""
    r = crash_loop(tmp_path, kills=30, writers=4, seed=11, pace_s=0.02)
    assert r["kills"] == 30
    _check(r)


@pytest.mark.slow
@pytest.mark.timeout(1800)
def test_crash_loop_long(tmp_path):
    r = crash_loop(tmp_path, kills=300, writers=4, seed=12, pace_s=0.01)
    assert r["kills"] == 300
    _check(r)


@pytest.mark.slow
@pytest.mark.timeout(1800)
def test_crash_loop_busy_writers(tmp_path):
    """No pacing: writers as fast as the daemon goes, so kills land mid-fsync more often."""
    r = crash_loop(tmp_path, kills=150, writers=3, seed=13, pace_s=0.0, min_gap_ms=50, max_gap_ms=150)
    assert r["kills"] == 150
    _check(r)
