"""Tests that start real processes (the daemon, the MCP front-ends, the command lines, supervisord) on
temporary data directories and end them by PID. Marked ``process`` by ``tests/conftest.py``."""
