"""Exactly once, end to end: an MCP host writing through a stdio front-end while the daemon is killed and
stopped at random around its writes.

The host behaves as the tool descriptions tell it to: a result is final; a BUSY error with
``outcome_unknown`` is retried with the error's ``request_id`` (and the same arguments); any other
retryable BUSY was not applied and is simply sent again. At the end every write is in the store exactly
once — 0 lost, 0 duplicated — counting the host's own retries.

The front-end autospawns its daemon, so a SIGKILL is met by the front-end starting another at once
(and resending the request in flight under the same request id); a SIGSTOP longer than the front-end's
attempts turns into an outcome-unknown answer that the host resolves with the request id.
"""
from __future__ import annotations

import os
import random
import signal
import time
from pathlib import Path
from typing import Any

import anyio
import pytest
from mcp import Client

from tests.support.mcp_fixtures import (  # noqa: F401  (fixtures)
    anyio_backend, call, data_dir, home, kill_daemons_of, pid_file, result_obj, stdio_params,
)

pytestmark = [pytest.mark.anyio]

SESSION = "chaos"


def _client(data_dir: Path, home: Path, *extra: str) -> Client:
    return Client(stdio_params(data_dir, home, "--timeout", "0.3", *extra), mode="legacy")  # type: ignore[arg-type]


async def _write_until_done(c: Client, i: int, stats: dict[str, int]) -> dict[str, Any]:
    """What a careful host does with one write: retry until it has a final answer."""
    args: dict[str, Any] = {"session_id": SESSION, "role": "user", "content": f"marker-{i:04d}"}
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        obj = result_obj(await c.call_tool("write_message", args))
        if obj["status"] == "OK":
            return obj["message"]
        err = obj["error"]
        assert err["code"] == "BUSY" and err["retryable"] is True, obj
        stats["retries"] += 1
        if err.get("outcome_unknown"):
            stats["unknown"] += 1
            assert isinstance(err["request_id"], str) and len(err["request_id"]) == 26
            args = {**args, "request_id": err["request_id"]}
        await anyio.sleep(min(err["retry_after_ms"], 300) / 1000)
    raise AssertionError(f"write {i} got no final answer in 60 s")


async def _chaos(data_dir: Path, rng: random.Random, stop: anyio.Event, stats: dict[str, int]) -> None:
    """Kill or pause whichever daemon serves the data dir, at random moments."""
    while not stop.is_set():
        await anyio.sleep(rng.uniform(0.15, 0.6))
        pid = pid_file(data_dir)
        if pid is None or stop.is_set():
            continue
        try:
            if rng.random() < 0.5:
                os.kill(pid, signal.SIGKILL)
                stats["kills"] += 1
            else:
                os.kill(pid, signal.SIGSTOP)
                stats["stops"] += 1
                try:
                    # sometimes shorter than the front-end's three 0.3 s attempts, sometimes longer
                    await anyio.sleep(rng.uniform(0.2, 1.6))
                finally:
                    os.kill(pid, signal.SIGCONT)
        except ProcessLookupError:
            pass


async def _all_contents(c: Client) -> list[str]:
    out, cursor = [], None
    while True:
        args: dict[str, Any] = {"view": "history", "session_id": SESSION, "limit": 1000}
        if cursor:
            args["cursor"] = cursor
        page = await call(c, "read_messages", args)
        assert page.get("status", "OK") != "ERROR", page
        out += [m["content"] for m in page["history"]]
        cursor = page.get("nextCursor")
        if not cursor:
            return out


async def _run(data_dir: Path, home: Path, writes: int, seed: int, events: int) -> dict[str, int]:
    """At least ``writes`` writes, and on until the chaos task has killed or stopped the daemon ``events``
    times."""
    rng = random.Random(seed)
    stats = {"retries": 0, "unknown": 0, "kills": 0, "stops": 0}
    acked: dict[str, str] = {}
    try:
        async with _client(data_dir, home) as c:
            assert (await call(c, "get_system_health"))["status"] in ("OK", "DEGRADED")
            stop = anyio.Event()
            async with anyio.create_task_group() as tg:
                tg.start_soon(_chaos, data_dir, rng, stop, stats)
                i = 0
                while i < writes or (stats["kills"] + stats["stops"] < events and i < 50 * writes):
                    msg = await _write_until_done(c, i, stats)
                    i += 1
                    assert msg["content"] not in acked, msg  # a retry never answers with another write's message
                    acked[msg["content"]] = msg["message_id"]
                stop.set()
            contents = await _all_contents(c)
    finally:
        pid = pid_file(data_dir)
        if pid is not None:
            try:
                os.kill(pid, signal.SIGCONT)
            except ProcessLookupError:
                pass
        kill_daemons_of(data_dir)
    expected = [f"marker-{n:04d}" for n in range(len(acked))]
    lost = sorted(set(expected) - set(contents))
    duplicated = sorted({x for x in contents if contents.count(x) > 1})
    assert (lost, duplicated) == ([], []), (lost, duplicated, stats)
    assert contents == expected  # and in the order the host wrote them
    return stats


async def test_kills_and_stops_around_writes_lose_and_duplicate_nothing(data_dir: Path, home: Path) -> None:
    # five events: seed 12 draws a stop longer than the front-end's three attempts, two kills, another
    # long stop and a short one (while no daemon runs a draw is skipped), every kind the chaos makes;
    # more events repeat them, which the long runs (-m slow) do
    stats = await _run(data_dir, home, writes=60, seed=int(os.environ.get("CONVMEM_CHAOS_SEED", "12")), events=5)
    assert stats["kills"] + stats["stops"] >= 5, stats
    assert stats["retries"] >= 1, stats


@pytest.mark.slow
@pytest.mark.timeout(900)
@pytest.mark.parametrize("seed", [1, 2, 3])
async def test_kills_and_stops_around_writes_long(data_dir: Path, home: Path, seed: int) -> None:
    stats = await _run(data_dir, home, writes=400, seed=seed, events=60)
    assert stats["unknown"] >= 1, stats


async def test_host_request_id_applies_update_and_delete_once(data_dir: Path, home: Path) -> None:
    """The host's own request_id on update and delete: the second call with it answers the first result
    and changes nothing; a malformed request_id is a VALIDATION_ERROR naming the field."""
    rid_u, rid_d = "01JD0000000000000000000001", "01JD0000000000000000000002"
    try:
        async with _client(data_dir, home) as c:
            w = await call(c, "write_message", {"session_id": "s", "role": "user", "content": "v1"})
            mid = w["message"]["message_id"]
            for _ in range(2):
                u = await call(c, "update_message", {"message_id": mid, "content": "v2", "request_id": rid_u})
                assert u["status"] == "OK" and u["message"]["revision"] == 2, u
            for _ in range(2):
                d = await call(c, "delete_message", {"message_id": mid, "request_id": rid_d})
                assert d == {"status": "OK"}, d
            bad = await call(c, "write_message", {"session_id": "s", "role": "user", "content": "x",
                                                  "request_id": "not-a-ulid-secret"})
            assert bad["status"] == "ERROR" and bad["error"]["code"] == "VALIDATION_ERROR", bad
            assert "request_id" in bad["error"]["message"] and "secret" not in bad["error"]["message"]
            same_id_other_tool = await call(c, "delete_message", {"message_id": mid, "request_id": rid_u})
            assert same_id_other_tool["status"] == "ERROR", same_id_other_tool
            health = await call(c, "get_system_health")
            assert health["active_messages"] == 0 and health["update_records"] == 1, health
    finally:
        kill_daemons_of(data_dir)
