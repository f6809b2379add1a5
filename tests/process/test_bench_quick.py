"""The benchmark command runs end to end (--quick): it checks that it runs, not how fast."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.support import ROOT

pytestmark = pytest.mark.timeout(300)



def test_bench_run_quick(tmp_path):
    out = tmp_path / "bench.json"
    proc = subprocess.run([sys.executable, "-m", "bench.run", "--quick", "--json", str(out)], cwd=ROOT,
                          capture_output=True, text=True, timeout=280)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    res = json.loads(out.read_text())
    for part in ("engine", "e2e", "crash"):
        assert "error" not in res[part], res[part]
    assert res["crash"]["lost"] == 0 and res["crash"]["duplicated"] == 0
    assert res["engine"]["engine_write"]["ours"]["n"] == 50
    figures = {row[0] for row in res["table"]}
    assert "durable write, MCP stdio, raw JSON-RPC client p50" in figures
    assert "convmem vs SQLite" in proc.stdout
