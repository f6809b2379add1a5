"""The scale benchmark (``python -m bench.scale``) runs every phase end to end on a tiny corpus and
reports every figure of issue 15's table: it checks that the command works, never how fast."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

import pytest

from protocol.config import read_pid
from tests.support import ROOT

pytestmark = pytest.mark.timeout(300)

# Rows where SQLite has a figure of its own (the others are the daemon's: RSS, SIGKILL, waits).
FTS5_ROWS = ("start after clean stop", "search_messages", "search_sessions", "ingest", "durable write", "on disk")


def test_bench_scale_tiny(tmp_path):
    d = tmp_path / "s"
    out = tmp_path / "scale.json"
    proc = subprocess.Popen([sys.executable, "-m", "bench.scale", "--events", "2000", "--dir", str(d), "--writes", "10",
                             "--queries", "60", "--rest-s", "2", "--json", str(out)], cwd=ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        stdout, stderr = proc.communicate(timeout=280)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        try:  # the benchmark ends its daemon itself; if it was killed first, end the daemon by its pid file
            os.kill(read_pid(str(d / "data")), signal.SIGKILL)
        except (FileNotFoundError, ProcessLookupError, ValueError):
            pass
    assert proc.returncode == 0, stdout[-3000:] + stderr[-3000:]
    res = json.loads(out.read_text())
    assert res["gen"]["messages"] >= 2000 and res["ingest"]["events"] == res["gen"]["messages"]
    assert res["fts5"]["events"] == res["gen"]["messages"]
    assert res["start"]["sigkill"]["tail_events"] == 200
    assert res["wait"]["rebuild"]["ok"] and res["wait"]["snapshot"]["events"] == 500
    for part in ("search_first", "search", "rebuild", "snapshot"):
        assert res["wait"][part]["probe"]["n"] > 0
    for kind in ("prompt", "error", "common", "rare", "all"):
        assert res["search"]["search_messages"]["latency_ms"][kind]["n"] > 0
    assert res["ingest"]["settled"]["rss"]["VmRSS"] > 0
    paced = res["search"]["paced"]
    assert paced["queries"] > 0 and paced["latency_ms"]["n"] == paced["queries"] and paced["rss_max"] > 0
    rested = res["search"]["rested"]
    assert rested["rss"]["VmRSS"] > 0 and set(rested["after_rest_ms"]) == set(rested["warm_ms"]) >= {"prompt", "rare"}
    assert len(res["table"]) == 21
    for label, ours, fts5, _target, met in res["table"]:
        assert ours != "-", label
        assert (fts5 != "-") == label.startswith(FTS5_ROWS), label
        assert met in ("met", "NOT met", "-"), label
    assert "convmem beside SQLite FTS5" in stdout
    # the kernels side by side on the same store, in-process (the daemon has stopped)
    kern = tmp_path / "kernels.json"
    run = subprocess.run([sys.executable, "-m", "bench.search_kernels", "--dir", str(d), "--json", str(kern)], cwd=ROOT,
                         capture_output=True, text=True, timeout=200)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    got = json.loads(kern.read_text())
    for tool in ("search_messages", "search_sessions"):
        for kernel in ("windows", "arrays"):
            assert got[tool][kernel]["all"]["n"] == len(json.loads((d / "corpus" / "queries.json").read_text()))
