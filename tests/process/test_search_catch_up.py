"""A search while the search index catches up, through the real MCP front-end and a real daemon: the
memory family answers BUSY with ``retry_after_ms``, the history family its retryable ``busy``; later the
same searches succeed and find what was imported.

Imports only queue their messages for the search index; the daemon indexes the queue between requests,
and a search first indexes what is queued for up to 40 ms when more than 500 messages are queued
(``SEARCH_CATCH_UP_BIG_S``; 250 ms for a small queue), else is answered
BUSY (``Store.catch_up``). To make a queue the daemon cannot index within that, several import
requests of ~1 KB messages are sent at once on separate sockets: they arrive together, so the daemon
handles them back to back with no idle time to index in between, and 3000 messages are queued the
moment the last reply leaves (the daemon indexes 1-2 thousand such texts a second on 2 cores: several
times what a search's 40 ms covers).

No timing is asserted. A round imports, then searches until the imported text is found; BUSY must be
seen by each family at least once within ``ROUNDS_MAX`` rounds (one suffices here: the queue takes
seconds to drain), so the test never depends on winning a race.
"""
from __future__ import annotations

import random
import time
from pathlib import Path
from typing import Any

import anyio
import msgpack
import pytest
import zmq
from mcp import Client
from ulid import ULID

from protocol import history as H
from protocol import limits as L
from protocol import wire
from tests.support.daemon_proc import new_rid
from tests.support.mcp_fixtures import (  # noqa: F401  (fixtures)
    Daemon, anyio_backend, daemon, data_dir, home, result_obj, stdio_params,
)

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(120)]

T0 = 1_767_225_600_000
BATCHES = 3                  # import requests sent at once per round, L.IMPORT_BATCH_MAX messages each
TEXT_BYTES = 1000            # per message: indexing cost grows with the words of a text
ROUNDS_MAX = 4
FOUND_DEADLINE_S = 90.0


def _words(seed: int) -> list[str]:
    rng = random.Random(seed)
    return ["".join(rng.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(rng.randint(3, 10))) for _ in range(5000)]


def _needle(rnd: int) -> str:
    return f"needle{rnd}zq"


def _import_at_once(daemon: Daemon, rnd: int, words: list[str]) -> int:
    """``BATCHES`` imports of ~``TEXT_BYTES`` messages sent together, one REQ socket each; every reply
    must be OK. The last message of the round carries the round's needle. Returns the messages queued."""
    rng = random.Random(rnd)
    sid = f"claude-code:bulk{rnd}"
    frames = []
    n = 0
    for b in range(BATCHES):
        msgs = []
        for _ in range(L.IMPORT_BATCH_MAX):
            n += 1
            text, size = [], 0
            while size < TEXT_BYTES:
                w = rng.choice(words)
                text.append(w)
                size += len(w) + 1
            ts = T0 + rnd * 10_000_000 + n
            msgs.append({"message_id": str(ULID.from_bytes(((ts << 80) | n).to_bytes(16, "big"))),
                         "session_id": sid, "timestamp": ts, "role": "user", "content": " ".join(text),
                         "event": {"type": "user_input"}})
        if b == BATCHES - 1:
            msgs[-1]["content"] += " " + _needle(rnd)
        frames.append(wire.encode_request("import_messages", {
            "messages": msgs, "sessions": [{"session_id": sid, "harness": "claude-code", "source": "claude",
                                            "title": f"bulk {rnd}"}] if b == 0 else []}, new_rid()))
    ctx = zmq.Context.instance()
    socks = [ctx.socket(zmq.REQ) for _ in frames]
    try:
        for s in socks:
            s.setsockopt(zmq.LINGER, 0)
            s.connect(daemon.endpoint)
        for s, f in zip(socks, frames):
            s.send(f)
        for s in socks:
            assert s.poll(60_000), "no reply to an import"
            rep = msgpack.unpackb(s.recv(), raw=False)
            assert rep.get("status") == "OK" and rep["imported"] == L.IMPORT_BATCH_MAX, rep
    finally:
        for s in socks:
            s.close(linger=0)
    return n


def _busy_memory(obj: dict[str, Any]) -> bool:
    """The memory family's BUSY, as the contract gives it; False for a success."""
    if obj.get("status") != "ERROR":
        return False
    err = obj["error"]
    assert err["code"] == "BUSY" and err["retryable"] is True and err["retry_after_ms"] > 0, obj
    assert "catching up" in err["message"], obj
    return True


def _busy_history(env: dict[str, Any], text: str) -> bool:
    """The history family's retryable busy (``from_memory_error``); False for a success."""
    if "error" not in env:
        assert env["schema_version"] == "convmem.mcp.search_sessions.v1", env
        return False
    assert env["schema_version"] == "convmem.mcp.error.v1", env
    err = env["error"]
    assert err["code"] == H.BUSY and err["retryable"] is True and err["retry_after_ms"] > 0, env
    assert H.BUSY in text
    return True


async def test_search_during_catch_up_is_busy_then_finds_the_import(daemon: Daemon, data_dir: Path,
                                                                     home: Path) -> None:
    words = _words(7)
    busy = {"search_messages": 0, "search_sessions": 0}
    async with Client(stdio_params(data_dir, home, "--no-spawn"), mode="legacy") as c:  # type: ignore[arg-type]
        assert result_obj(await c.call_tool("search_messages", {"query": "warm"}))["results"] == []
        for rnd in range(ROUNDS_MAX):
            _import_at_once(daemon, rnd, words)
            needle = _needle(rnd)
            found: dict[str, bool] = {}
            deadline = time.monotonic() + FOUND_DEADLINE_S
            while len(found) < 2:
                assert time.monotonic() < deadline, f"round {rnd}: {needle} not found in {FOUND_DEADLINE_S} s"
                wait_ms = 0
                if "search_messages" not in found:
                    obj = result_obj(await c.call_tool("search_messages", {"query": needle}))
                    if _busy_memory(obj):
                        busy["search_messages"] += 1
                        wait_ms = obj["error"]["retry_after_ms"]
                    else:
                        assert obj["results"][0]["content"].endswith(" " + needle), obj
                        found["search_messages"] = True
                if "search_sessions" not in found:
                    r = await c.call_tool("search_sessions", {"query": needle})
                    env = r.structured_content
                    assert r.is_error == ("error" in env)
                    if _busy_history(env, r.content[0].text):
                        busy["search_sessions"] += 1
                        wait_ms = env["error"]["retry_after_ms"]
                    else:
                        hits = env["data"]["results"]
                        assert hits and hits[0]["session"]["title"] == f"bulk {rnd}", env
                        found["search_sessions"] = True
                await anyio.sleep(wait_ms / 1000)
            if all(busy.values()):
                break
    assert all(busy.values()), f"no BUSY from some search in {ROUNDS_MAX} rounds: {busy}"
    print(f"\nBUSY answers seen: {busy} in {rnd + 1} round(s)")
