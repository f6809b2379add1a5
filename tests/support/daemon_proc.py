"""The test suite's handle on real ``python -m storaged`` processes.

``Daemon``, ``Client`` (Lazy Pirate), ``DaemonPool`` and their helpers are ``bench.daemon``'s (one
definition, also driven by the crash-loop benchmark); what only the tests need is here: finding and
checking processes by PID, running the daemon to completion, and comparing stored states.
"""
from __future__ import annotations

import os
import subprocess
from typing import Any

from bench.daemon import PYTHON, ROOT, Client, Daemon, DaemonExited, DaemonPool, NoReply, daemon_env, new_rid

__all__ = ["PYTHON", "ROOT", "Client", "Daemon", "DaemonExited", "DaemonPool", "NoReply", "daemon_env", "new_rid",
           "pid_alive", "pids_mentioning", "run_storaged", "state_of"]


def pid_alive(pid: int) -> bool:
    """Running (not gone, not a zombie)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rsplit(b")", 1)[1].split()[0] != b"Z"
    except OSError:
        return False


def pids_mentioning(needle: str) -> list[int]:
    """Live processes whose command line contains ``needle`` (our temp dir is unique)."""
    out = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                cmdline = f.read().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if needle in cmdline and pid_alive(int(entry)):
            out.append(int(entry))
    return out


def run_storaged(args: list[str], timeout: float = 60.0) -> subprocess.CompletedProcess:
    """Run ``python -m storaged ARGS`` to completion (salvage, refused starts)."""
    return subprocess.run([PYTHON, "-m", "storaged", *args], cwd=ROOT, env=daemon_env(), capture_output=True,
                          text=True, timeout=timeout)



def state_of(messages: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """message_id → the whole Message object: what 'identical state' compares."""
    return {m["message_id"]: m for m in messages}
