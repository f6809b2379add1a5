"""Where the data lives and where the daemon listens, computed from the environment.

Pure functions of an environment mapping, so both processes (and tests) derive the same defaults.
"""
from __future__ import annotations

import os
from collections.abc import Mapping

RUN_DIR_NAME = "run"
SOCKET_NAME = "storaged.sock"
PID_NAME = "storaged.pid"


def default_data_dir(env: Mapping[str, str] = os.environ) -> str:
    if env.get("CONVMEM_DATA_DIR"):
        return os.path.abspath(env["CONVMEM_DATA_DIR"])
    base = env.get("XDG_DATA_HOME") or os.path.join(env.get("HOME") or os.path.expanduser("~"), ".local", "share")
    return os.path.abspath(os.path.join(base, "convmem"))


def run_dir(data_dir: str) -> str:
    """The private (0700) directory holding the daemon's ipc socket."""
    return os.path.join(os.path.abspath(data_dir), RUN_DIR_NAME)


def pid_path(data_dir: str) -> str:
    """The running daemon's pid (written once it listens, removed at a clean stop)."""
    return os.path.join(run_dir(data_dir), PID_NAME)


def default_endpoint(data_dir: str, env: Mapping[str, str] = os.environ) -> str:
    if env.get("CONVMEM_ENDPOINT"):
        return env["CONVMEM_ENDPOINT"]
    return "ipc://" + os.path.join(run_dir(data_dir), SOCKET_NAME)
