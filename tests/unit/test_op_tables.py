"""The tables that name the daemon's ops agree with each other (in-process, no daemon started).

An op lives in several tables: the wire's list of ops (``protocol.wire.OPS``), the validators the
daemon runs before a handler sees a request, the daemon's handlers (``storaged.server``) and the MCP
tools of the front-end (``mcpfront.tools``). One added to one table and forgotten in another would
answer "unknown op" or fail with a KeyError only when first called; here it fails at once.
"""
from __future__ import annotations

import pytest

from mcpfront import tools as T
from protocol import errors as E
from protocol import history as H
from protocol import validation as V
from protocol import wire
from storaged.server import Server
from storaged.store import Store

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
def handlers(tmp_path):
    """The daemon's handler table, as it is built for an opened store (the socket is never bound)."""
    store = Store.open(str(tmp_path / "data"))
    server = Server(store, "inproc://convmem-op-tables")
    try:
        yield dict(server.handlers)
    finally:
        server.close()
        store.close()


def test_every_op_has_a_handler_and_every_handler_an_op(handlers):
    assert set(handlers) == wire.OPS


def test_every_op_has_a_validator():
    assert set(wire._ALL_VALIDATORS) == wire.OPS


def test_every_mcp_tool_is_an_op():
    assert set(T.ALL_TOOLS) <= wire.OPS
    assert set(T.ALL_TOOLS) == set(wire.TOOLS) | set(wire.HISTORY_TOOLS)


def test_tool_families_name_known_tools():
    assert set(wire.READ_ONLY_TOOLS) <= set(T.ALL_TOOLS)
    assert set(V.HOST_REQUEST_ID_TOOLS) <= set(wire.TOOLS) - wire.READ_ONLY_TOOLS
    assert H.LAUNCH_CONTEXT_TOOLS <= set(wire.HISTORY_TOOLS)
    assert E.RETRYABLE <= set(E.ERROR_CODES)


def test_read_only_annotation_follows_the_protocol():
    read_only = {name for name, (ro, _, _) in T.ANNOTATIONS.items() if ro}
    assert read_only == wire.READ_ONLY_TOOLS
