"""Running the real ``convmem`` admin CLI as a subprocess against a test daemon.

HOME, XDG_DATA_HOME and XDG_STATE_HOME point into the test's temp dir (so the default transcript
locations and the checkpoint file are the test's own); ``--no-spawn`` always, so the CLI talks to the
daemon the test started (by PID, via tests/support/daemon_proc.py) and never starts one of its own.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from tests.support import ROOT

_SCRIPT = Path(sys.executable).with_name("convmem")
CONVMEM = [str(_SCRIPT)] if _SCRIPT.exists() else [sys.executable, "-m", "admin"]


def cli_env(home: Path, extra: dict[str, str] | None = None) -> dict[str, str]:
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": str(home),
        "XDG_DATA_HOME": str(home / "xdg-data"),
        "XDG_STATE_HOME": str(home / "xdg-state"),
        "PYTHONPATH": str(ROOT),
        "PYTHONUNBUFFERED": "1",
        "LANG": "C.UTF-8",
    }
    if extra:
        env.update(extra)
    return env


def cli_cmd(data_dir: str | Path, *args: str, timeout_s: float = 10.0) -> list[str]:
    return [*CONVMEM, "--data-dir", str(data_dir), "--no-spawn", "--timeout", str(timeout_s), *args]


def convmem(data_dir: str | Path, home: Path, *args: str, stdin: bytes | None = None, timeout: float = 120.0,
            request_timeout_s: float = 10.0) -> subprocess.CompletedProcess:
    """Run ``convmem ARGS`` to completion; stdout/stderr as text (stderr is a pipe: not a terminal)."""
    return subprocess.run(cli_cmd(data_dir, *args, timeout_s=request_timeout_s), cwd=str(home),
                          env=cli_env(home), input=stdin, capture_output=True, timeout=timeout)


def out_json(proc: subprocess.CompletedProcess) -> dict[str, Any]:
    """The one-line JSON summary a command printed on stdout (and checks it exited 0)."""
    stdout = proc.stdout.decode()
    assert proc.returncode == 0, f"rc={proc.returncode}\nstdout={stdout[-2000:]}\nstderr={proc.stderr.decode()[-4000:]}"
    lines = [ln for ln in stdout.splitlines() if ln.strip()]
    assert len(lines) == 1, stdout[-2000:]
    return json.loads(lines[0])


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


class FakeTty:
    """A terminal for admin.progress to draw on: keeps what was written."""

    def __init__(self) -> None:
        self.text = ""

    def isatty(self) -> bool:
        return True

    def write(self, s: str) -> None:
        self.text += s

    def flush(self) -> None:
        pass
