"""Helpers shared by the test modules, imported as ``from tests.support import daemon_proc``:

- ``daemon_proc``: real ``python -m storaged`` processes and a raw Lazy-Pirate client (the engine is
  ``bench.daemon``, which the crash-loop benchmark drives too), plus the tests' own process helpers;
- ``mcp_fixtures``: front-end processes and the SDK's MCP client, as pytest fixtures;
- ``admin_cli``: the ``convmem`` command line run as a process;
- ``loop_steps``: the daemon's request loop (``storaged.server.Server``) driven a step at a time in-process;
- ``faultio``: file layers that fail on purpose or model a power cut, and store shorthands;
- ``release_store``: stores written by earlier releases (in ``fixtures/``) and what they answered;
- ``clockshift``: a process whose wall clock reads as another day (a fixture's request ids are fresh then);
- ``fixtures/``: data the tests read (transcripts in the shape of real ones, stores of earlier releases).
"""
from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent.parent
"""The checkout: the working directory and PYTHONPATH of every process the tests start."""

FIXTURES = Path(__file__).resolve().parent / "fixtures"
