"""The daemon's request loop (``storaged.server.Server``) driven a step at a time from a test, in-process.

A test that needs to act between two turns of the loop — make ``os.fork`` fail for one fork, hold a
worker, cut a file — calls the steps ``Server._serve`` would call, in the same order: ``call`` for a
request (``Server.handle``, as a batch of one), ``run_rebuild`` for what the loop does once a rebuild's
worker was forked. The forks are real; only the socket is left out.
"""
from __future__ import annotations

from typing import Any

from protocol import wire


def call(server, op: str, args: dict[str, Any], request_id: str | None = None) -> dict[str, Any] | None:
    """``op`` handled as the loop handles a request from a peer (None: an import queued, answered later)."""
    from ulid import ULID

    return server.handle([wire.encode_request(op, args, request_id or str(ULID()))], [b"peer", b""])


def run_rebuild(server, rid: str) -> dict[str, Any]:
    """What the request loop does for a rebuild once its worker was forked: reap it, read its
    result in steps, install it (no relocation step in between: the test decides when it moves)."""
    from storaged import children

    code = children.reap(server.rebuild_child, block=True)
    server._rebuild_exited(code)
    while server.rebuild_reading is not None:
        server._read_rebuild_step()
    server._finish_rebuild()
    return server.rebuild_results[rid]
