"""Where the data lives and where the daemon listens, computed from the environment.

Pure functions of an environment mapping, so both processes (and tests) derive the same defaults,
and the names of the files the daemon and its clients share in the data directory. One function
reads a file: ``read_pid``, the daemon's pid as every process that looks for it reads it.
"""
from __future__ import annotations

import os
from collections.abc import Mapping

RUN_DIR_NAME = "run"
SOCKET_NAME = "storaged.sock"
PID_NAME = "storaged.pid"
# How the daemon ends a start it cannot make, as the front-end that started it reads it: one stderr line
# with this prefix, and this exit status when another daemon already owns the data directory.
DAEMON_FAIL_PREFIX = "convmem-storaged: "
DAEMON_EXIT_LOCKED = 3
# ... and when it cannot use its data directory or endpoint at all (a file, not private, cannot bind).
DAEMON_EXIT_CANNOT_START = 2
# The store's identity: a random id written once at the first start, reported by ping, so a front-end
# can tell its own daemon from one serving another data directory on the same endpoint.
STORE_ID_NAME = "store-id"
# The text log of a daemon a front-end started (its --log-file, in the data directory).
DAEMON_LOG_NAME = "storaged.log"
# The bearer token of the HTTP front-end (0600, created at its first start).
HTTP_TOKEN_NAME = "http-token"
# The daemon's CURVE allow-list: a directory of client public-key certificates (``*.key``).
CURVE_CLIENTS_DIR = os.path.join("curve", "clients")
# Environment variables naming key files (command-line options override them).
ENV_CURVE_SERVER_KEY_FILE = "CONVMEM_CURVE_SERVER_KEY_FILE"
ENV_CURVE_CLIENT_KEY_FILE = "CONVMEM_CURVE_CLIENT_KEY_FILE"
ENV_HTTP_TOKEN_FILE = "CONVMEM_HTTP_TOKEN_FILE"


# What every command's --data-dir help says of the default below.
DATA_DIR_HELP = "data directory (default: $CONVMEM_DATA_DIR, else $XDG_DATA_HOME/convmem)"


def default_data_dir(env: Mapping[str, str] = os.environ) -> str:
    if env.get("CONVMEM_DATA_DIR"):
        return os.path.abspath(env["CONVMEM_DATA_DIR"])
    return standard_data_dir(env)


def standard_data_dir(env: Mapping[str, str] = os.environ) -> str:
    """The XDG location. The only data directory whose missing parents are created: anywhere else a
    missing parent is far more likely a typo than a wish for a new, empty store."""
    base = env.get("XDG_DATA_HOME") or os.path.join(env.get("HOME") or os.path.expanduser("~"), ".local", "share")
    return os.path.abspath(os.path.join(base, "convmem"))


def run_dir(data_dir: str) -> str:
    """The private (0700) directory holding the daemon's ipc socket."""
    return os.path.join(os.path.abspath(data_dir), RUN_DIR_NAME)


def pid_path(data_dir: str) -> str:
    """The running daemon's pid (written once it listens, removed at a clean stop)."""
    return os.path.join(run_dir(data_dir), PID_NAME)


def read_pid(data_dir: str) -> int:
    """The pid in the daemon's pid file (one decimal line, ``storaged.datadir.write_pid``). Raises
    FileNotFoundError when there is none (no daemon, or a clean stop), another OSError when it cannot
    be read and ValueError when it holds no number. Whether that pid is still the daemon is the
    caller's question: a crashed daemon leaves its pid file behind."""
    with open(pid_path(data_dir)) as f:
        return int(f.read().strip())


def default_endpoint(data_dir: str, env: Mapping[str, str] = os.environ) -> str:
    if env.get("CONVMEM_ENDPOINT"):
        return env["CONVMEM_ENDPOINT"]
    return "ipc://" + os.path.join(run_dir(data_dir), SOCKET_NAME)


def store_id_path(data_dir: str) -> str:
    return os.path.join(os.path.abspath(data_dir), STORE_ID_NAME)


def http_token_path(data_dir: str) -> str:
    return os.path.join(os.path.abspath(data_dir), HTTP_TOKEN_NAME)


def curve_clients_dir(data_dir: str) -> str:
    return os.path.join(os.path.abspath(data_dir), CURVE_CLIENTS_DIR)
