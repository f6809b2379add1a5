"""The MCP front-end over stdio, end to end: the SDK's real client, a real front-end process, a real daemon."""
from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import anyio
import pytest
from jsonschema import Draft202012Validator

from tests.support.mcp_fixtures import (  # noqa: F401  (fixtures)
    Daemon, anyio_backend, call, daemon, daemon_pids, data_dir, frontend_cmd, frontend_env, home,
    kill_daemons_of, kill_pid, pid_file, procs, result_obj, stdio_params,
)

from mcp import Client
from mcp.shared.exceptions import MCPError
from protocol import limits as L
from protocol.wire import HISTORY_TOOLS, TOOLS

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(90)]

SECRET = "S3CR3T-VALUE-xyzzy"


def client(data_dir: Path, home: Path, *extra: str, mode: str = "legacy") -> Client:
    return Client(stdio_params(data_dir, home, *extra), mode=mode)  # type: ignore[arg-type]


def assert_error(obj: dict[str, Any], code: str) -> dict[str, Any]:
    assert obj["status"] == "ERROR", obj
    assert set(obj) == {"status", "error"}
    assert obj["error"]["code"] == code, obj
    assert isinstance(obj["error"]["message"], str) and obj["error"]["message"]
    return obj["error"]


# --- tools/list ----------------------------------------------------------------------------------

async def test_tools_list_without_daemon(data_dir: Path, home: Path) -> None:
    """initialize + tools/list need no daemon (none runs, none may be spawned) and describe the contract."""
    t0 = time.monotonic()
    async with client(data_dir, home, "--no-spawn") as c:
        tools = (await c.list_tools()).tools
    assert time.monotonic() - t0 < 20  # a cold Python start plus two round trips; no daemon timeout in it
    assert daemon_pids(data_dir) == []
    by_name = {t.name: t for t in tools}
    assert list(by_name) == list(TOOLS) + list(HISTORY_TOOLS)  # every family by default
    for t in tools:
        assert t.description and len(t.description) > 150, t.name
        s = t.input_schema
        assert s["type"] == "object" and s["additionalProperties"] is False
        assert not {"anyOf", "oneOf", "allOf"} & set(s), "hosts refuse top-level combinators in input schemas"
        Draft202012Validator.check_schema(s)
        assert t.output_schema is not None and t.output_schema["type"] == "object"
        Draft202012Validator.check_schema(t.output_schema)
        assert t.annotations is not None

    def props(name: str) -> dict[str, Any]:
        return by_name[name].input_schema["properties"]

    assert by_name["write_message"].input_schema["required"] == ["session_id", "role", "content"]
    assert props("write_message")["role"]["enum"] == list(L.ROLES)
    assert props("write_message")["content"]["maxLength"] == L.CONTENT_MAX_BYTES
    assert props("write_message")["session_id"]["maxLength"] == L.SESSION_ID_MAX_BYTES
    assert props("write_message")["metadata_json"]["default"] == "{}"
    assert by_name["update_message"].input_schema["required"] == ["message_id"]
    assert props("update_message")["expected_revision"]["minimum"] == L.EXPECTED_REVISION_MIN
    rm = props("read_messages")
    assert rm["view"]["enum"] == list(L.VIEWS) and rm["view"]["default"] == L.VIEW_DEFAULT
    assert (rm["limit"]["minimum"], rm["limit"]["maximum"], rm["limit"]["default"]) == (
        L.READ_LIMIT_MIN, L.READ_LIMIT_MAX, L.READ_LIMIT_DEFAULT)
    assert (rm["content_limit"]["maximum"], rm["content_limit"]["default"]) == (
        L.CONTENT_LIMIT_MAX, L.CONTENT_LIMIT_DEFAULT)
    assert rm["before"]["maximum"] == L.CONTEXT_BEFORE_MAX and rm["relation_depth"]["maximum"] == L.RELATION_DEPTH_MAX
    sm = props("search_messages")
    assert by_name["search_messages"].input_schema["required"] == ["query"]
    assert (sm["limit"]["maximum"], sm["limit"]["default"]) == (L.SEARCH_LIMIT_MAX, L.SEARCH_LIMIT_DEFAULT)
    assert sm["context_size"]["maximum"] == L.CONTEXT_SIZE_MAX and sm["query"]["maxLength"] == L.QUERY_MAX_BYTES
    assert props("rebuild_index") == {} and props("get_system_health") == {}

    ann = {n: t.annotations for n, t in by_name.items()}
    for n in ("read_messages", "search_messages", "get_system_health"):
        assert ann[n].read_only_hint is True and ann[n].idempotent_hint is True
    for n in ("write_message", "update_message", "delete_message", "rebuild_index"):
        assert ann[n].read_only_hint is False
    assert ann["delete_message"].destructive_hint is True and ann["rebuild_index"].destructive_hint is True
    assert ann["delete_message"].idempotent_hint is True and ann["rebuild_index"].idempotent_hint is True
    assert ann["write_message"].destructive_hint is False
    assert ann["write_message"].idempotent_hint is False and ann["update_message"].idempotent_hint is False
    assert "search_messages" in by_name["read_messages"].description  # narrow-to-wide guidance


# --- every tool end to end -----------------------------------------------------------------------

async def test_every_tool_end_to_end(daemon: Daemon, data_dir: Path, home: Path) -> None:
    async with client(data_dir, home, "--no-spawn") as c:
        meta = {"tags": ["project", "decision"], "memory_kind": "semantic", "importance": 80,
                "summary": "database choice"}
        w1 = await call(c, "write_message", {"session_id": "s1", "role": "user",
                                             "content": "We chose PostgreSQL for the database.",
                                             "metadata_json": json.dumps(meta)})
        assert w1["status"] == "OK" and w1["message"]["revision"] == 1
        m1 = w1["message"]
        assert m1["metadata"]["tags"] == ["project", "decision"] and m1["metadata"]["importance"] == 80
        m2 = (await call(c, "write_message", {"session_id": "s1", "role": "assistant",
                                              "content": "Noted: PostgreSQL it is."}))["message"]
        rel = json.dumps({"relations": [{"type": "derived_from", "message_id": m1["message_id"]}]})
        m3 = (await call(c, "write_message", {"session_id": "s1", "role": "user", "content": "Follow-up on it.",
                                              "metadata_json": rel}))["message"]
        long_text = "今日は日本語の会議について話しました。" * 300  # > 4096 bytes, multi-byte
        m4 = (await call(c, "write_message", {"session_id": "s2", "role": "user", "content": long_text}))["message"]

        # update: change, no-op, conflict
        u = await call(c, "update_message", {"message_id": m1["message_id"], "content": "We chose SQLite.",
                                             "expected_revision": 1})
        assert u["status"] == "OK" and u["changed"] is True and u["message"]["revision"] == 2
        assert u["message"]["metadata"]["tags"] == ["project", "decision"]  # kept
        same = await call(c, "update_message", {"message_id": m1["message_id"], "content": "We chose SQLite."})
        assert same["changed"] is False and same["message"]["revision"] == 2
        r = await c.call_tool("update_message", {"message_id": m1["message_id"], "content": "x",
                                                 "expected_revision": 1})
        assert r.is_error
        assert_error(result_obj(r), "CONFLICT")

        # read: history (paged), sessions, context, content
        p1 = await call(c, "read_messages", {"session_id": "s1", "limit": 2})
        assert [m["message_id"] for m in p1["history"]] == [m1["message_id"], m2["message_id"]]
        p2 = await call(c, "read_messages", {"view": "history", "session_id": "s1", "cursor": p1["nextCursor"]})
        assert [m["message_id"] for m in p2["history"]] == [m3["message_id"]] and "nextCursor" not in p2
        ss = await call(c, "read_messages", {"view": "sessions"})
        assert {s["session_id"]: s["message_count"] for s in ss["sessions"]} == {"s1": 3, "s2": 1}
        ctx = await call(c, "read_messages", {"view": "context", "message_id": m2["message_id"]})
        assert ctx["message"]["message_id"] == m2["message_id"]
        assert [m["message_id"] for m in ctx["chronological_context"]["before"]] == [m1["message_id"]]
        assert [m["message_id"] for m in ctx["chronological_context"]["after"]] == [m3["message_id"]]
        assert ctx["session"] == {"session_id": "s1", "message_count": 3} and ctx["truncated"] is False
        ctx3 = await call(c, "read_messages", {"view": "context", "message_id": m3["message_id"],
                                               "relation_types_json": '["derived_from"]'})
        assert [(x["type"], x["direction"], x["message"]["message_id"]) for x in ctx3["relations"]] == [
            ("derived_from", "outgoing", m1["message_id"])]
        got, offset, revision = b"", 0, None
        while True:
            args: dict[str, Any] = {"view": "content", "message_id": m4["message_id"], "content_offset": offset}
            if revision is not None:
                args["expected_revision"] = revision
            cr = (await call(c, "read_messages", args))["content_range"]
            revision = cr["revision"]
            got += cr["content"].encode()
            offset = cr["next_content_offset"]
            if cr["complete"]:
                break
        assert got.decode() == long_text and cr["total_bytes"] == len(long_text.encode())

        # search: English with filters, Japanese without spaces
        hits = await call(c, "search_messages", {"query": "SQLite", "filters_json": '{"kinds":["semantic"]}',
                                                 "context_size": 1})
        assert [h["message_id"] for h in hits["results"]] == [m1["message_id"]]
        h = hits["results"][0]
        assert h["score"] > 0 and "content" in h["matched_fields"] and h["relation_count"] == 1
        assert [m["message_id"] for m in h["context_preview"]["after"]] == [m2["message_id"]]
        ja = await call(c, "search_messages", {"query": "日本語の会議"})
        assert [x["message_id"] for x in ja["results"]] == [m4["message_id"]]

        # delete: OK, NOT_FOUND (not an error), session guard
        guarded = await c.call_tool("delete_message", {"message_id": m2["message_id"], "session_id": "s2"})
        assert not guarded.is_error and result_obj(guarded) == {"status": "NOT_FOUND"}
        assert await call(c, "delete_message", {"message_id": m2["message_id"]}) == {"status": "OK"}
        again = await c.call_tool("delete_message", {"message_id": m2["message_id"]})
        assert not again.is_error and result_obj(again) == {"status": "NOT_FOUND"}
        assert (await call(c, "search_messages", {"query": "Noted"}))["results"] == []

        # rebuild: the final figures; health
        rb = await call(c, "rebuild_index")
        assert rb["status"] == "OK" and rb["messages_indexed"] == 3 and rb["records_removed"] >= 1
        assert rb["bytes_before"] > 0 and rb["bytes_after"] > 0
        health = await call(c, "get_system_health")
        assert health["status"] == "OK" and health["active_messages"] == 3 and health["session_count"] == 2
        assert health["memory_estimate"]["total_bytes"] > 0 and health["io"]["replace_calls"] >= 1


# --- errors --------------------------------------------------------------------------------------

BAD_ARGUMENTS = [
    ("wrong type", "write_message", {"session_id": 12345, "role": "user", "content": "x"}),
    ("wrong type: string for integer", "read_messages", {"session_id": "s", "limit": "10"}),
    ("wrong type: fraction", "read_messages", {"session_id": "s", "limit": 1.5}),
    ("wrong type: object", "search_messages", {"query": {"q": SECRET}}),
    ("missing", "write_message", {"session_id": "s", "role": "user"}),
    ("missing history session", "read_messages", {"view": "history"}),
    ("missing both", "update_message", {"message_id": "01ARZ3NDEKTSV4RRFFQ69G5FAV"}),
    ("out of range", "read_messages", {"session_id": "s", "limit": L.READ_LIMIT_MAX + 1}),
    ("out of range low", "search_messages", {"query": "x", "limit": 0}),
    ("out of range revision", "update_message", {"message_id": "01ARZ3NDEKTSV4RRFFQ69G5FAV", "content": "x",
                                                 "expected_revision": 0}),
    ("too long", "write_message", {"session_id": SECRET * 100, "role": "user", "content": "x"}),
    ("empty", "write_message", {"session_id": "s", "role": "user", "content": ""}),
    ("enum", "write_message", {"session_id": "s", "role": SECRET, "content": "x"}),
    ("view enum", "read_messages", {"view": SECRET}),
    ("bad ulid", "delete_message", {"message_id": SECRET}),
    ("beyond 64 bits", "read_messages", {"session_id": "s", "limit": 10 ** 30}),
    ("bad metadata json", "write_message", {"session_id": "s", "role": "user", "content": "x",
                                            "metadata_json": "{" + SECRET}),
    ("metadata not an object", "write_message", {"session_id": "s", "role": "user", "content": "x",
                                                 "metadata_json": f'["{SECRET}"]'}),
    ("metadata out of range", "write_message", {"session_id": "s", "role": "user", "content": "x",
                                                "metadata_json": '{"importance": 1234567}'}),
    ("metadata bad enum", "write_message", {"session_id": "s", "role": "user", "content": "x",
                                            "metadata_json": json.dumps({"memory_kind": SECRET})}),
    ("bad filters", "search_messages", {"query": "x", "filters_json": json.dumps({"kinds": [SECRET]})}),
    ("unknown extra param", "write_message", {"session_id": "s", "role": "user", "content": "x",
                                              "colour": SECRET}),
    ("param of another view", "read_messages", {"view": "sessions", "message_id": "01ARZ3NDEKTSV4RRFFQ69G5FAV"}),
    ("param to a no-param tool", "get_system_health", {"verbose": SECRET}),
    ("param to rebuild", "rebuild_index", {"force": True}),
]


async def test_bad_arguments_are_validation_errors(daemon: Daemon, data_dir: Path, home: Path) -> None:
    async with client(data_dir, home, "--no-spawn") as c:
        schemas = {t.name: t.output_schema for t in (await c.list_tools()).tools}
        for label, tool, args in BAD_ARGUMENTS:
            r = await c.call_tool(tool, args)
            assert r.is_error, label
            # some clients (the MCP Inspector) check error results against outputSchema too
            Draft202012Validator(schemas[tool]).validate(r.structured_content)
            err = assert_error(result_obj(r), "VALIDATION_ERROR")
            assert set(err) == {"code", "message"}, label
            msg = err["message"]
            assert SECRET not in msg and "1234567" not in msg and str(10 ** 30) not in msg, (label, msg)
            assert "Traceback" not in msg and "pydantic" not in msg.lower(), (label, msg)
        # nothing of that reached the store
        health = await call(c, "get_system_health")
        assert health["active_messages"] == 0 and health["last_sequence"] == 0


async def test_error_messages_name_the_field(daemon: Daemon, data_dir: Path, home: Path) -> None:
    async with client(data_dir, home, "--no-spawn", mode="auto") as c:  # the 2026-07-28 protocol, no handshake
        r = await call(c, "write_message", {"session_id": "s", "role": "user", "content": "x",
                                            "metadata_json": '{"importance": 1234567}'})
        assert "metadata_json.importance" in r["error"]["message"]
        assert str(L.IMPORTANCE_MAX) in r["error"]["message"]
        r = await call(c, "read_messages", {"session_id": "s", "limit": 10 ** 30})
        assert r["error"]["message"].startswith("limit")
        r = await call(c, "read_messages", {"view": "content", "message_id": "01ARZ3NDEKTSV4RRFFQ69G5FAV"})
        assert_error(r, "NOT_FOUND")
        with pytest.raises(MCPError) as info:
            await c.call_tool("no_such_tool", {})
        assert info.value.code == -32602


async def test_unknown_tool_is_jsonrpc_invalid_params(daemon: Daemon, data_dir: Path, home: Path) -> None:
    async with client(data_dir, home, "--no-spawn") as c:
        with pytest.raises(MCPError) as info:
            await c.call_tool("no_such_tool_" + SECRET, {})
        assert info.value.code == -32602
        assert SECRET not in info.value.message
        # the session is still fine afterwards
        assert (await call(c, "get_system_health"))["status"] == "OK"


# --- stdout carries nothing but the protocol -----------------------------------------------------

def _send(proc: subprocess.Popen, msg: dict[str, Any]) -> None:
    assert proc.stdin is not None
    proc.stdin.write((json.dumps(msg) + "\n").encode())
    proc.stdin.flush()


def _read_line(proc: subprocess.Popen, deadline: float) -> bytes:
    assert proc.stdout is not None
    fd = proc.stdout.fileno()
    buf = b""
    while not buf.endswith(b"\n"):
        left = deadline - time.monotonic()
        assert left > 0, "no reply in time"
        ready, _, _ = select.select([fd], [], [], left)
        if ready:
            chunk = os.read(fd, 1)
            if not chunk:
                return buf
            buf += chunk
    return buf


def test_stdout_is_only_protocol(daemon: Daemon, data_dir: Path, home: Path, procs: Any) -> None:
    proc = procs.start(frontend_cmd(data_dir, "--no-spawn", "--log-level", "DEBUG"), frontend_env(home),
                       stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 30
    lines: list[bytes] = []

    def request(rid: int, method: str, params: dict[str, Any]) -> dict[str, Any]:
        _send(proc, {"jsonrpc": "2.0", "id": rid, "method": method, "params": params})
        while True:
            line = _read_line(proc, deadline)
            lines.append(line)
            msg = json.loads(line)
            if msg.get("id") == rid:
                return msg

    init = request(1, "initialize", {"protocolVersion": "2025-06-18", "capabilities": {},
                                     "clientInfo": {"name": "raw", "version": "0"}})
    assert init["result"]["serverInfo"]["name"] == "convmem"
    _send(proc, {"jsonrpc": "2.0", "method": "notifications/initialized"})
    assert len(request(2, "tools/list", {})["result"]["tools"]) == len(TOOLS) + len(HISTORY_TOOLS)
    ok = request(3, "tools/call", {"name": "write_message",
                                   "arguments": {"session_id": "s", "role": "user", "content": "hi"}})
    assert ok["result"]["isError"] is False and ok["result"]["structuredContent"]["status"] == "OK"
    bad = request(4, "tools/call", {"name": "write_message", "arguments": {"session_id": 1}})
    assert bad["result"]["isError"] is True
    assert json.loads(bad["result"]["content"][0]["text"])["error"]["code"] == "VALIDATION_ERROR"
    unknown = request(5, "tools/call", {"name": "nope", "arguments": {}})
    assert unknown["error"]["code"] == -32602
    assert proc.stdin is not None
    proc.stdin.close()
    assert proc.wait(15) == 0
    assert proc.stdout is not None
    lines.extend(proc.stdout.read().splitlines())
    for line in lines:
        if line.strip():
            assert json.loads(line)["jsonrpc"] == "2.0", line


# --- daemon unavailable --------------------------------------------------------------------------

async def test_busy_when_daemon_down_then_recovers(data_dir: Path, home: Path,
                                                   tmp_path_factory: pytest.TempPathFactory) -> None:
    d = Daemon(data_dir, log_dir=tmp_path_factory.mktemp("logs"))
    try:
        async with client(data_dir, home, "--no-spawn", "--timeout", "0.3") as c:
            t0 = time.monotonic()
            r = await c.call_tool("write_message", {"session_id": "s", "role": "user", "content": "x"})
            elapsed = time.monotonic() - t0
            assert r.is_error
            err = assert_error(result_obj(r), "BUSY")
            assert err["retryable"] is True and err["retry_after_ms"] > 0
            assert "unavailable" in err["message"]
            assert elapsed < 10, elapsed  # three short attempts, never a hang

            d.start(timeout=30)
            assert (await call(c, "get_system_health"))["status"] == "OK"
            w = await call(c, "write_message", {"session_id": "s", "role": "user", "content": "after start"})
            assert w["status"] == "OK"

            d.kill()  # SIGKILL by PID
            assert_error(await call(c, "get_system_health"), "BUSY")

            d.start(timeout=30)
            hist = await call(c, "read_messages", {"session_id": "s"})
            assert [m["content"] for m in hist["history"]] == ["after start"]
    finally:
        d.close()


async def test_retry_after_timeout_applies_a_write_once(daemon: Daemon, data_dir: Path, home: Path) -> None:
    """A daemon that stalls past the timeout gets the write again under the same request id: one message."""
    async with client(data_dir, home, "--no-spawn", "--timeout", "0.4") as c:
        assert (await call(c, "get_system_health"))["status"] == "OK"
        pid = daemon.pid
        assert pid is not None
        os.kill(pid, signal.SIGSTOP)
        try:
            async with anyio.create_task_group() as tg:
                out: dict[str, Any] = {}

                async def write() -> None:
                    out["r"] = await call(c, "write_message", {"session_id": "once", "role": "user",
                                                               "content": "exactly once"})
                tg.start_soon(write)
                await anyio.sleep(0.6)  # the first attempt has timed out, the second is queued
                os.kill(pid, signal.SIGCONT)
        finally:
            os.kill(pid, signal.SIGCONT)
        assert out["r"]["status"] == "OK", out
        hist = await call(c, "read_messages", {"session_id": "once"})
        assert [m["content"] for m in hist["history"]] == ["exactly once"]


# --- concurrency ---------------------------------------------------------------------------------

async def test_concurrent_calls_overlap(data_dir: Path, home: Path) -> None:
    """Five calls that each wait out their timeouts finish in about the time of one (no daemon at all)."""
    async with client(data_dir, home, "--no-spawn", "--timeout", "0.4") as c:
        t0 = time.monotonic()
        await call(c, "get_system_health")
        one = time.monotonic() - t0  # 3 attempts x 0.5 s
        results: list[dict[str, Any]] = []

        async def slow() -> None:
            results.append(await call(c, "get_system_health"))
        t0 = time.monotonic()
        async with anyio.create_task_group() as tg:
            for _ in range(5):
                tg.start_soon(slow)
        five = time.monotonic() - t0
    assert len(results) == 5 and all(r["error"]["code"] == "BUSY" for r in results)
    assert five < one * 2.5, (one, five)  # serialised would be 5x


async def test_concurrent_writes_all_succeed(daemon: Daemon, data_dir: Path, home: Path) -> None:
    async with client(data_dir, home, "--no-spawn") as c:
        results: list[dict[str, Any]] = []

        async def write(i: int) -> None:
            results.append(await call(c, "write_message", {"session_id": "conc", "role": "user",
                                                           "content": f"message {i}"}))
        async with anyio.create_task_group() as tg:
            for i in range(20):
                tg.start_soon(write, i)
        assert all(r["status"] == "OK" for r in results)
        assert len({r["message"]["message_id"] for r in results}) == 20
        hist = await call(c, "read_messages", {"session_id": "conc"})
        assert sorted(m["content"] for m in hist["history"]) == sorted(f"message {i}" for i in range(20))


async def test_busy_passes_through_during_rebuild(daemon: Daemon, data_dir: Path, home: Path) -> None:
    """Mutations during a rebuild get the daemon's BUSY (retryable, retry_after_ms) unchanged.

    The rebuild must last long enough for a write to land inside it: the store is seeded directly
    over the daemon's socket. If the machine is so fast that no write lands inside, the test skips.
    """
    def seed(k: int) -> None:
        with daemon.client() as dc:
            for i in range(250):
                dc.call("write_message", {"session_id": f"seed{k}", "role": "user",
                                          "content": f"seed {k} {i} " + "lorem ipsum dolor sit amet " * 40})
    with ThreadPoolExecutor(8) as pool:
        list(pool.map(seed, range(8)))

    async with client(data_dir, home, "--no-spawn") as c:
        busy: list[dict[str, Any]] = []
        done = anyio.Event()
        out: dict[str, Any] = {}

        async def rebuild() -> None:
            out["rebuild"] = await call(c, "rebuild_index")
            done.set()

        async with anyio.create_task_group() as tg:
            tg.start_soon(rebuild)
            while not done.is_set():
                r = await c.call_tool("write_message", {"session_id": "during", "role": "user", "content": "x"})
                obj = result_obj(r)
                if obj["status"] == "ERROR":
                    assert r.is_error
                    busy.append(obj)
                await anyio.sleep(0.005)
        assert out["rebuild"]["status"] == "OK" and out["rebuild"]["messages_indexed"] >= 2000
        if not busy:
            pytest.skip("the rebuild finished before any write landed inside it")
        for obj in busy:
            err = assert_error(obj, "BUSY")
            assert err["retryable"] is True and err["retry_after_ms"] > 0
            assert "unavailable" not in err["message"]  # the daemon's BUSY, not the front-end's


# --- autospawn -----------------------------------------------------------------------------------

async def test_autospawn_race_leaves_one_daemon(data_dir: Path, home: Path, procs: Any) -> None:
    """Two front-ends start at once on an empty data dir with no daemon: both calls succeed, one daemon."""
    procs.watch_data_dir(data_dir)  # teardown kills whatever daemon the front-ends started
    target = data_dir / "fresh"
    procs.watch_data_dir(target)
    results: list[dict[str, Any]] = []

    async def run(i: int) -> None:
        async with client(target, home, "--timeout", "2") as c:
            results.append(await call(c, "write_message", {"session_id": "spawn", "role": "user",
                                                           "content": f"from front-end {i}"}))
            results.append(await call(c, "read_messages", {"session_id": "spawn"}))

    async with anyio.create_task_group() as tg:
        tg.start_soon(run, 0)
        tg.start_soon(run, 1)
    assert all(r.get("status", "OK") == "OK" for r in results), results
    alive = daemon_pids(target)
    assert len(alive) == 1, alive
    assert pid_file(target) == alive[0]
    assert (target / "storaged.log").exists()
    assert os.stat(target / "run").st_mode & 0o077 == 0
    kill_pid(alive[0])
    assert daemon_pids(target) == []


async def test_no_spawn_means_no_daemon(data_dir: Path, home: Path) -> None:
    async with client(data_dir, home, "--no-spawn", "--timeout", "0.2") as c:
        assert_error(await call(c, "get_system_health"), "BUSY")
    assert daemon_pids(data_dir) == []
