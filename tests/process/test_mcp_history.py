"""The history tools end to end: the SDK's real client (which checks every structuredContent against the
tool's outputSchema), a real front-end process over stdio and HTTP, a real daemon.

What the in-process view tests (test_history_views.py) cannot see is checked here: the twelve tools
and ``--tools``, the ``convmem.mcp.<tool>.v1`` envelope and its error form, the text summary that
carries every id, file_attention resolved against the directory the client was launched from, the
retry hint while the daemon is still loading, and how many bytes an agent receives.
"""
from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from ulid import ULID

from tests.support.mcp_fixtures import (  # noqa: F401  (fixtures)
    Daemon, anyio_backend, daemon, data_dir, frontend_env, home, kill_daemons_of, procs, result_obj,
    stdio_params,
)

from mcp import Client, StdioServerParameters
from protocol import history as H
from protocol.wire import HISTORY_TOOLS, TOOLS

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(120)]

T0 = 1_767_225_600_000


def client(data_dir: Path, home: Path, *extra: str, cwd: Path | None = None) -> Client:
    p = stdio_params(data_dir, home, *extra)
    if cwd is not None:
        p = StdioServerParameters(command=p.command, args=p.args, env=p.env, cwd=str(cwd))
    return Client(p, mode="legacy")  # type: ignore[arg-type]


async def hcall(c: Client, name: str, args: dict[str, Any]) -> dict[str, Any]:
    """A history tool's envelope; checks the envelope's invariants and the text summary."""
    r = await c.call_tool(name, args)
    env = r.structured_content
    assert len(r.content) == 1 and r.content[0].type == "text"
    text = r.content[0].text
    assert env["tool"] == name and isinstance(env["warnings"], list)
    assert isinstance(env["performance"]["elapsed_ms"], (int, float)) and env["performance"]["elapsed_ms"] >= 0
    if r.is_error:
        assert env["schema_version"] == "convmem.mcp.error.v1" and set(env["error"]) >= {"code", "message", "details"}
        assert env["error"]["code"] in H.ERROR_CODES and env["error"]["code"] in text
    else:
        assert env["schema_version"] == f"convmem.mcp.{name}.v1" and "data" in env and "error" not in env
        for w in env["warnings"]:
            assert w in text
    return env


def mid(ts: int, n: int) -> str:
    return str(ULID.from_bytes(((ts << 80) | n).to_bytes(16, "big")))


def import_events(daemon: Daemon, events: list[dict], sessions: list[dict] | None = None) -> None:
    with daemon.client() as c:
        r = c.call("import_messages", {"messages": events, "sessions": sessions or []})
        assert r["status"] == "OK", r


def ev(n: int, sid: str, etype: str, content: str, **event: Any) -> dict:
    ts = T0 + n * 1000
    return {"message_id": mid(ts, n), "session_id": sid, "timestamp": ts, "role": H.EVENT_ROLE[etype],
            "content": content, "event": {"type": etype, **event}}


# --- the tool list ---------------------------------------------------------------------------------

@pytest.mark.parametrize("family,expected", [("all", TOOLS + HISTORY_TOOLS), ("memory", TOOLS),
                                             ("history", HISTORY_TOOLS)])
async def test_tools_families(data_dir: Path, home: Path, family: str, expected: tuple[str, ...]) -> None:
    extra = ("--no-spawn",) if family == "all" else ("--no-spawn", "--tools", family)
    async with client(data_dir, home, *extra) as c:
        tools = (await c.list_tools()).tools
        assert [t.name for t in tools] == list(expected)
        for t in tools:
            if t.name in HISTORY_TOOLS:
                assert t.annotations.read_only_hint is True and t.annotations.destructive_hint is False
                assert "History family" in t.description
        if family == "memory":
            # a tool of another family is unknown here: a JSON-RPC error, as for any unknown tool
            from mcp.shared.exceptions import MCPError

            with pytest.raises(MCPError):
                await c.call_tool("search_sessions", {"query": "x"})


# --- narrow to wide ----------------------------------------------------------------------------------

async def test_narrow_to_wide_over_stdio(daemon: Daemon, data_dir: Path, home: Path) -> None:
    big = ("2026/01/01 10:00:00 [error] 1234#0: *5 upstream timed out (110: Connection timed out) while reading "
           "response header from upstream, client: 10.0.0.1, server: api, request: \"GET /v1 HTTP/1.1\"\n") * 100
    sid = "claude-code:nginx"
    import_events(daemon, [
        ev(1, sid, "user_input", "the api returns 502 bad gateway, please investigate"),
        ev(2, sid, "tool_call", json.dumps({"command": "tail -n 100 /var/log/nginx/error.log"}), tool_name="Bash"),
        ev(3, sid, "tool_response", big, tool_name="Bash", exit_code=0, is_error=False),
        ev(4, sid, "assistant_response", "nginx times out waiting for the upstream: raise proxy_read_timeout",
           model="claude-x"),
    ], [{"session_id": sid, "harness": "claude-code", "source": "claude", "title": "nginx 502"}])
    async with client(data_dir, home, "--no-spawn") as c:
        # the default searches what was asked and concluded, not raw tool output
        env = await hcall(c, "search_sessions", {"query": "upstream timed out"})
        assert {h["event"]["type"] for h in env["data"]["results"]} <= {"user_input", "assistant_response"}
        env = await hcall(c, "search_sessions", {"query": "upstream timed out", "event_types": ["tool_response"]})
        assert env["request"]["event_types"] == ["tool_response"] and env["request"]["n_hits"] == 10
        hit = env["data"]["results"][0]
        assert hit["event"]["tool_name"] == "Bash" and hit["session"]["title"] == "nginx 502"
        assert len(hit["snippet"]["text"]) <= H.SNIPPET_CHARS + 2 and hit["snippet"]["truncated"]
        r = await c.call_tool("search_sessions", {"query": "upstream timed out", "event_types": ["tool_response"]})
        text = r.content[0].text
        for handle in hit["open"].values():
            assert handle in text     # a host that shows only text still gets every id
        # open the event: the exact output, whole
        event = await hcall(c, "open", {"id": hit["open"]["event_id"]})
        assert event["data"]["content"]["text"] == big and event["data"]["content"]["exit_code"] == 0
        assert event["request"] == {"id": hit["open"]["event_id"]}
        # the same event through the memory family: its message_id reads byte ranges
        chunk = result_obj(await c.call_tool("read_messages", {
            "view": "content", "message_id": event["data"]["event"]["message_id"], "content_limit": 100}))
        assert big.startswith(chunk["content_range"]["content"])
        turn = await hcall(c, "open", {"id": hit["open"]["turn_id"]})
        assert turn["data"]["events"] == [] and turn["data"]["summary"]["tools_called"] == ["Bash"]
        assert turn["data"]["summary"]["final_response"]["text"].startswith("nginx times out")
        page = await hcall(c, "open", {"id": hit["open"]["turn_id"], "limit": 2})
        assert len(page["data"]["events"]) == 2 and page["data"]["next_cursor"]
        rest = await hcall(c, "open", {"cursor": page["data"]["next_cursor"]})
        assert [e["ordinal"] for e in rest["data"]["events"]] == [3, 4] and rest["data"]["next_cursor"] is None
        session = await hcall(c, "open", {"id": hit["open"]["session_id"]})
        assert session["data"]["session"]["turn_count"] == 1 and session["data"]["session"]["mode"] == "tool_calling"
        listed = await hcall(c, "list_sessions", {"start_datetime": "2025-12-31T00:00:00Z",
                                                   "end_datetime": "2026-01-02T00:00:00+09:00"})
        assert [s["id"] for s in listed["data"]["sessions"]] == [hit["open"]["session_id"]]
        status = await hcall(c, "get_ingest_status", {})
        assert {x["condition_type"] for x in status["data"]["conditions"]} == {"health", "coverage", "freshness",
                                                                             "readiness"}


async def test_errors_in_the_interface_shape(daemon: Daemon, data_dir: Path, home: Path) -> None:
    async with client(data_dir, home, "--no-spawn") as c:
        cases = [
            ("search_sessions", {"query": " "}, "invalid_request"),
            ("search_sessions", {"query": "x", "event_types": ["debug_trace"]}, "unsupported_event_type"),
            ("search_sessions", {"query": "x", "n_hits": 500}, "invalid_request"),
            ("search_sessions", {"query": "x", "within_id": "event:" + "A" * 32}, "invalid_request"),
            ("open", {}, "invalid_request"),
            ("open", {"id": "not-an-id"}, "invalid_id"),
            ("open", {"id": "event:" + "A" * 32}, "invalid_id"),
            ("open", {"id": "x", "cursor": "y"}, "invalid_request"),
            ("list_sessions", {"start_datetime": "2026-01-01T00:00:00"}, "invalid_request"),
            ("file_attention", {"path": "file:///etc/passwd"}, "invalid_request"),
            ("get_ingest_status", {"x": 1}, "invalid_request"),
            ("search_sessions", {"query": "x", "bogus-name": "secret-value-123"}, "invalid_request"),
        ]
        for name, args, code in cases:
            env = await hcall(c, name, args)
            assert env["error"]["code"] == code, (name, args, env)
            # the error's request echoes the tool's own parameters only, never an unknown name or value
            assert "bogus-name" not in json.dumps(env) and "secret-value-123" not in json.dumps(env)
        # a well-formed id of this store that names nothing
        hit_env = await hcall(c, "search_sessions", {"query": "anything"})
        assert hit_env["data"]["results"] == []


async def test_unavailable_daemon_is_busy_retryable(data_dir: Path, home: Path) -> None:
    async with client(data_dir, home, "--no-spawn", "--timeout", "0.2") as c:
        env = await hcall(c, "search_sessions", {"query": "anything"})
        assert env["error"]["code"] == "busy" and env["error"]["retryable"] is True
        assert env["error"]["retry_after_ms"] > 0 and env["request"] == {"query": "anything"}


async def test_read_model_refresh_while_the_daemon_loads(data_dir: Path, home: Path, procs) -> None:
    """A daemon still opening its store answers at once: the history family's read_model_refresh (and
    the memory family's BUSY), both retryable with a positive retry_after_ms; then it serves."""
    from tests.support.daemon_proc import Client as ZClient, daemon_env
    from protocol.config import default_endpoint

    env = daemon_env({"CONVMEM_FAULT_LOAD_DELAY_S": "4"})
    proc = procs.start([sys.executable, "-m", "storaged", "--data-dir", str(data_dir)], env)
    procs.watch_data_dir(data_dir)
    endpoint = default_endpoint(str(data_dir), {})
    with ZClient(endpoint, timeout_ms=2000, retries=20) as z:
        deadline = time.monotonic() + 20
        while True:
            rep = z.try_call("ping", {})
            if isinstance(rep, dict) and rep.get("loading"):
                break
            assert time.monotonic() < deadline and proc.poll() is None
            if rep is None:
                z.reset()
        rep = z.call("search_sessions", {"query": "x"})
        assert rep["error"]["code"] == "internal_error" and rep["error"]["details"]["reason"] == "read_model_refresh"
        assert rep["error"]["retryable"] is True and rep["error"]["retry_after_ms"] > 0
        rep = z.call("write_message", {"session_id": "s", "role": "user", "content": "x"})
        assert rep["error"]["code"] == "BUSY" and rep["error"]["retry_after_ms"] > 0
    async with client(data_dir, home, "--no-spawn", "--timeout", "0.2") as c:
        env = await hcall(c, "search_sessions", {"query": "x"})
        if "error" in env:   # still loading: the front-end passed the hint on after its short wait
            assert env["error"]["details"]["reason"] == "read_model_refresh" and env["error"]["retryable"]
        deadline = time.monotonic() + 30
        while "error" in env:
            assert time.monotonic() < deadline
            time.sleep(env["error"]["retry_after_ms"] / 1000)
            env = await hcall(c, "search_sessions", {"query": "x"})
        assert env["data"]["results"] == []


# --- file_attention from the client's launch directory ---------------------------------------------

def make_repo(base: Path) -> tuple[Path, Path]:
    """A git checkout (``.git`` directory) and a linked worktree (``.git`` file + commondir), by hand."""
    repo = base / "repo"
    (repo / ".git" / "worktrees" / "feat").mkdir(parents=True)
    (repo / "src").mkdir()
    wt = base / "wt-feat"
    (wt / "src").mkdir(parents=True)
    (wt / ".git").write_text(f"gitdir: {repo}/.git/worktrees/feat\n")
    (repo / ".git" / "worktrees" / "feat" / "commondir").write_text("../..\n")
    other = base / "other"
    (other / ".git").mkdir(parents=True)
    (other / "src").mkdir()
    return repo, wt


async def test_file_attention_from_the_launch_directory(daemon: Daemon, data_dir: Path, home: Path,
                                                        tmp_path: Path) -> None:
    from ingest import workspace

    repo, wt = make_repo(tmp_path)
    common = str((repo / ".git").resolve())

    def touch(n: int, sid: str, path: Path, op: str, tool: str) -> dict:
        r = workspace.resolve(str(path), str(repo))
        return ev(n, sid, "tool_call", json.dumps({"file_path": str(path)}), tool_name=tool,
                  files=[{"path": r.path, "root": r.root, "tail": r.tail, "project": r.project, "op": op}])

    import_events(daemon, [ev(1, "claude-code:a", "user_input", "fix the app"),
                           touch(2, "claude-code:a", repo / "src" / "app.py", "edit", "Edit"),
                           ev(3, "claude-code:b", "user_input", "in the worktree"),
                           touch(4, "claude-code:b", wt / "src" / "app.py", "read", "Read"),
                           ev(5, "codex:c", "user_input", "another repo"),
                           touch(6, "codex:c", tmp_path / "other" / "src" / "app.py", "edit", "apply_patch")],
                  [{"session_id": "claude-code:a", "harness": "claude-code", "source": "claude", "project": common},
                   {"session_id": "claude-code:b", "harness": "claude-code", "source": "claude", "project": common},
                   {"session_id": "codex:c", "harness": "codex", "source": "codex"}])
    async with client(data_dir, home, "--no-spawn", cwd=repo / "src") as c:
        for path in ("src/app.py", str(wt / "src" / "app.py"), str(repo / "src" / "app.py")):
            env = await hcall(c, "file_attention", {"path": path if not path.startswith("src") else "../src/app.py"})
            d = env["data"]
            assert d["tail"] == "src/app.py" and d["tail_is_absolute"] is False, (path, d)
            assert d["summary"]["total_touches"] == 2 and d["summary"]["distinct_roots"] == 2
            assert {r["root"] for r in d["roots"]} == {str(repo), str(wt)} and d["summary"]["ambiguous"]
        everywhere = await hcall(c, "file_attention", {"path": "../src/app.py", "scope": "all", "granularity": "events"})
        assert everywhere["data"]["summary"]["total_touches"] == 3
        assert {e["event"]["tool_name"] for e in everywhere["data"]["events"]} == {"Edit", "Read", "apply_patch"}
        edits = await hcall(c, "file_attention", {"path": "../src/app.py", "mutations_only": True})
        assert edits["data"]["summary"]["total_touches"] == 1
        # a file that does not exist (yet) keeps the launch project's provenance
        none = await hcall(c, "file_attention", {"path": "new_module.py"})
        assert none["data"]["tail"] == "src/new_module.py" and none["data"]["summary"]["total_touches"] == 0


# --- HTTP ----------------------------------------------------------------------------------------------

async def test_history_over_http(daemon: Daemon, data_dir: Path, home: Path, procs) -> None:
    from tests.process.test_mcp_http import start_http

    import_events(daemon, [ev(1, "s-http", "user_input", "検索のテスト: データベース移行"),
                           ev(2, "s-http", "assistant_response", "移行は来週です")])
    port = start_http(procs, data_dir, home)
    from tests.support.mcp_fixtures import http_client, read_http_token

    async with http_client(f"http://127.0.0.1:{port}/mcp", read_http_token(data_dir)) as c:
        env = await hcall(c, "search_sessions", {"query": "データベース移行"})
        hits = env["data"]["results"]
        assert [h["event"]["type"] for h in hits] == ["user_input", "assistant_response"]   # the phrase ranks first
        opened = await hcall(c, "open", {"id": env["data"]["results"][0]["open"]["event_id"]})
        assert opened["data"]["content"]["text"].startswith("検索のテスト")


# --- what an agent receives ------------------------------------------------------------------------------

async def test_snippets_not_bodies(daemon: Daemon, data_dir: Path, home: Path) -> None:
    """The issue's example: one 20 KB message made search_messages return 22 KB for three hits."""
    async with client(data_dir, home, "--no-spawn") as c:
        body = "We decided to move the billing service to PostgreSQL. " + ("context " * 2500)
        for i in range(3):
            result_obj(await c.call_tool("write_message", {"session_id": f"s{i}", "role": "assistant",
                                                           "content": f"{i}: {body}"}))
        old = await c.call_tool("search_messages", {"query": "billing PostgreSQL", "limit": 3})
        new = await c.call_tool("search_sessions", {"query": "billing PostgreSQL", "n_hits": 3})
        old_bytes = len(old.content[0].text.encode())
        new_bytes = len(json.dumps(new.structured_content).encode())
        assert len(new.structured_content["data"]["results"]) == 3
        assert old_bytes > 60_000 and new_bytes < 6_000, (old_bytes, new_bytes)
        assert len(new.content[0].text.encode()) < 3_000
