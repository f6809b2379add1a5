"""The search index's segments are checked against their CRCs after a start, not before it
(segment.DEFERRED): a daemon whose snapshot maps a rotten segment starts and serves, finds the damage on
its low-priority check, drops the index and builds it again from the log (its catch-up child taking
half), answering searches BUSY meanwhile and writes as always; health says what happened until the
index is whole again; the next start maps only sound segments and finds nothing wrong."""
from __future__ import annotations

import os
import signal
import time

import numpy as np
import pytest

from storaged.segment import Segment, is_index_segment_name
from storaged.server import SPLIT_MIN
from tests.process.test_split_catch_up import _import, _search
from tests.support.daemon_proc import Daemon
from tests.support.words import unique_word as _word

pytestmark = pytest.mark.timeout(240)

N = SPLIT_MIN + 1_000


def _rot(data_dir) -> str:
    """Flip a bit of a posting's slot in the biggest index segment; its name."""
    name = max((n for n in os.listdir(data_dir) if is_index_segment_name(n)),
               key=lambda n: os.path.getsize(os.path.join(data_dir, n)))
    path = os.path.join(data_dir, name)
    seg = Segment(path)
    whole, slots = np.frombuffer(seg._buf, np.uint8), np.frombuffer(seg._slots[0], np.uint8)
    off = slots.ctypes.data - whole.ctypes.data + len(slots) // 2
    del seg, whole, slots
    with open(path, "r+b") as f:
        f.seek(off)
        b = f.read(1)
        f.seek(off)
        f.write(bytes([b[0] ^ 0x04]))
    return name


def _wait_for(d: Daemon, text: str, timeout_s: float = 60.0) -> str:
    deadline = time.monotonic() + timeout_s
    while text not in (log := d.stderr()):
        assert time.monotonic() < deadline, log[-3000:]
        time.sleep(0.02)
    return log


def test_a_rotten_segment_is_found_after_the_start_and_the_index_built_again(tmp_path, monkeypatch):
    d = Daemon(tmp_path / "data")
    with d:
        d.start()
        with d.client(timeout_ms=60_000) as c:
            ids = _import(c, N)
            assert _search(c, _word(0))[0]["message_id"] == ids[0]
        d.terminate(signal.SIGTERM)   # the clean stop's snapshot names the index's segments
        name = _rot(tmp_path / "data")

        # the new index's catch-up child waits a little, so that health is asked while it is built
        # (5,000 messages are indexed again in about a second on a quiet machine)
        monkeypatch.setenv("CONVMEM_FAULT_SPLIT_DELAY_S", "3")
        d.start()
        monkeypatch.delenv("CONVMEM_FAULT_SPLIT_DELAY_S")
        log = _wait_for(d, "the search index was damaged")
        assert name in log and "fails its checksum" in log
        with d.client(timeout_ms=60_000) as c:
            health = c.call("get_system_health", {})
            assert health["status"] == "DEGRADED" and "built again from the log" in health["last_error"], health
            # writes go on while the index is built again
            rep = c.call("write_message", {"session_id": "claude-code:after", "role": "user",
                                           "content": "a zebrafish wrote this while the index was rebuilt"})
            assert rep["status"] == "OK", rep
            for i in [*range(0, N, 97), N - 1]:
                hits = _search(c, _word(i))
                assert hits and hits[0]["message_id"] == ids[i], i
            assert _search(c, "zebrafish")[0]["message_id"] == rep["message"]["message_id"]
            # built again: health is no longer DEGRADED for it
            health = c.call("get_system_health", {})
            assert health["status"] == "OK" and health["last_error"] == "", health
        assert "the search index has been built again from the log" in d.stderr()
        d.terminate(signal.SIGTERM)

        d.start()
        log = _wait_for(d, "passed their CRC check")
        assert "damaged" not in log.split("passed their CRC check")[-1]
        with d.client(timeout_ms=60_000) as c:
            assert c.call("get_system_health", {})["status"] == "OK"
            assert _search(c, _word(N // 2))[0]["message_id"] == ids[N // 2]
        assert name not in os.listdir(tmp_path / "data")   # no snapshot names it any more: collected
