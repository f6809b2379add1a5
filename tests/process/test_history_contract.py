"""An independent review of the history interface (issue #11) against its contract, with real processes.

Everything here runs against a real ``python -m storaged`` (its socket, ``tests/support/daemon_proc.py``), real
``convmem import-transcripts`` runs, real MCP front-ends (stdio and HTTP) driven by the SDK's client —
which itself checks every structuredContent against the tool's outputSchema — and, for one check, the
MCP Inspector CLI. Every process a test starts is ended by PID.

The contract: the issue, the interface document the project follows for its history tools (and the
fuller Moraine interface specification it summarises), and the design notes. Tests named
``test_violation_*`` encode the twelve violations the review found (a file from another repository
answered with the launch repo's file, HTTP resolving paths against the server's directory, a damaged
document pinning coverage, a long CJK query blocking the daemon, turns reopened by a compaction note,
snippets missing the match after case folding changed lengths, hits matched through ingest tags, top-n
not a prefix of the ranking, union-typed inputs the Inspector CLI sends as strings, event traversal
crossing turns, ties not ordered by the visible event id, millisecond bounds off by one): each failed
before its fix and guards it now. The others pin rules that held.
"""
from __future__ import annotations

import contextlib
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import unicodedata
from pathlib import Path
from typing import Any, Iterator

import pytest
from ulid import ULID

from tests.support.admin_cli import convmem, out_json
from tests.support.daemon_proc import Daemon, DaemonPool, new_rid
from tests.support.mcp_fixtures import (frontend_cmd, frontend_env, free_port, http_client, kill_pid,
                                        read_http_token, stdio_params, wait_port)

from protocol import history as H
from protocol import wire
from protocol.history import iso_ms
from tests import support

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(120)]

FIXTURES = support.FIXTURES / "transcripts"
ALL_TYPES = list(H.EVENT_TYPES)
WIDE = ("2000-01-01T00:00:00Z", "2100-01-01T00:00:00Z")


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


# =================================================================================== harness pieces
class Lab:
    """A short temp dir (ipc paths must fit), the daemons and raw processes started in it; all ended
    by PID at teardown."""

    def __init__(self, prefix: str = "hc") -> None:
        self.base = Path(tempfile.mkdtemp(prefix=prefix, dir="/tmp"))
        self.pool = DaemonPool(self.base)
        self.procs: list[subprocess.Popen] = []
        self.home = self.base / "home"
        self.home.mkdir()

    def daemon(self, name: str = "d") -> Daemon:
        return self.pool.new(name).start(timeout=30)

    def popen(self, cmd: list[str], **kw: Any) -> subprocess.Popen:
        kw.setdefault("stdin", subprocess.DEVNULL)
        kw.setdefault("stdout", subprocess.DEVNULL)
        kw.setdefault("stderr", subprocess.DEVNULL)
        p = subprocess.Popen(cmd, **kw)
        self.procs.append(p)
        return p

    def close(self) -> None:
        for p in self.procs:
            if p.poll() is None:
                kill_pid(p.pid)
            with contextlib.suppress(Exception):
                p.wait(5)
        self.pool.close_all()
        shutil.rmtree(self.base, ignore_errors=True)


@contextlib.contextmanager
def lab_ctx(prefix: str = "hc") -> Iterator[Lab]:
    lab = Lab(prefix)
    try:
        yield lab
    finally:
        lab.close()


_N = [0]


def mid(ts: int) -> str:
    """A fresh message id at ``ts`` (unique across the module: a counter in the random part)."""
    _N[0] += 1
    return str(ULID.from_bytes(((ts << 80) | _N[0]).to_bytes(16, "big")))


def ev(sid: str, etype: str, content: str, ts: int, **event: Any) -> dict[str, Any]:
    return {"message_id": mid(ts), "session_id": sid, "timestamp": ts, "role": H.EVENT_ROLE[etype],
            "content": content, "event": {"type": etype, **event}}


def ms(text: str) -> int:
    return H.parse_datetime(text, "t")


def call(d: Daemon, op: str, args: Any = None, context: dict | None = None, timeout_ms: int = 30_000) -> dict:
    with d.client(timeout_ms=timeout_ms, retries=0) as c:
        rep = c.send_frames([wire.encode_request(op, {} if args is None else args, new_rid(), context)])
    assert isinstance(rep, dict), f"{op}: no reply"
    return rep


def ok(rep: dict) -> dict:
    assert rep.get("status") == "OK", rep
    return rep["data"]


def put(d: Daemon, messages: list[dict], sessions: list[dict] | None = None, checkpoints: list | None = None) -> None:
    rep = call(d, "import_messages", {"messages": messages, "sessions": sessions or [],
                                      "checkpoints": checkpoints or []})
    assert rep.get("status") == "OK", rep


def find(d: Daemon, query: str, **kw: Any) -> list[dict]:
    return ok(call(d, "search_sessions", {"query": query, **kw}))["results"]


def open_(d: Daemon, **args: Any) -> dict:
    return ok(call(d, "open", args))


def mcp_client(data_dir: str, home: Path, cwd: Path, *extra: str):
    from mcp import Client, StdioServerParameters

    p = stdio_params(data_dir, home, "--no-spawn", *extra)
    return Client(StdioServerParameters(command=p.command, args=p.args, env=p.env, cwd=str(cwd)), mode="legacy")


async def hcall(client: Any, name: str, args: dict) -> dict:
    """A history tool's envelope over MCP, with the envelope's invariants checked."""
    r = await client.call_tool(name, args)
    env = r.structured_content
    assert len(r.content) == 1 and r.content[0].type == "text"
    assert set(env) == ({"schema_version", "tool", "request", "error", "warnings", "performance"} if r.is_error
                        else {"schema_version", "tool", "request", "data", "warnings", "performance"}), env.keys()
    assert env["tool"] == name and isinstance(env["warnings"], list) and isinstance(env["request"], dict)
    assert isinstance(env["performance"]["elapsed_ms"], (int, float)) and env["performance"]["elapsed_ms"] >= 0
    if r.is_error:
        assert env["schema_version"] == "convmem.mcp.error.v1"
        assert env["error"]["code"] in H.ERROR_CODES and isinstance(env["error"]["details"], dict)
        assert env["error"]["code"] in r.content[0].text
    else:
        assert env["schema_version"] == f"convmem.mcp.{name}.v1"
    return env


# ------------------------------------------------------------------ transcripts written for the tests
def claude_line(sid: str, cwd: str, uuid: str, ts: str, role: str, content: Any, model: str | None = None) -> str:
    obj: dict[str, Any] = {"parentUuid": None, "isSidechain": False, "userType": "external", "cwd": cwd,
                           "sessionId": sid, "version": "2.0.31", "type": role,
                           "message": {"role": role, "content": content}, "uuid": uuid, "timestamp": ts}
    if model:
        obj["message"]["model"] = model
    return json.dumps(obj)


def claude_transcript(path: Path, sid: str, cwd: Path, prompt: str, calls: list[tuple[str, dict, str]],
                      extra_lines: list[str] | None = None) -> None:
    """One Claude Code session: a prompt, then each (tool, input, time) as tool_use + tool_result."""
    tag = sid[-4:]
    lines = list(extra_lines or [])
    lines.append(claude_line(sid, str(cwd), f"00000000-0000-4000-8000-{tag}00000000", "2026-02-01T00:00:00.000Z",
                             "user", prompt))
    for i, (tool, args, ts) in enumerate(calls):
        lines.append(claude_line(sid, str(cwd), f"00000000-0000-4000-8000-{tag}{i + 1:08d}", ts, "assistant",
                                 [{"type": "tool_use", "id": f"tu{tag}{i}", "name": tool, "input": args}],
                                 model="claude-x"))
        lines.append(claude_line(sid, str(cwd), f"00000000-0000-4000-8001-{tag}{i + 1:08d}", ts, "user",
                                 [{"type": "tool_result", "tool_use_id": f"tu{tag}{i}", "content": "done"}]))
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(lines) + "\n")


def import_transcripts(lab: Lab, d: Daemon, harness: str, where: Path) -> dict:
    return out_json(convmem(d.data_dir, lab.home, "import-transcripts", harness, str(where), timeout=60))


# =================================================================================== the shared store
SECRETS = {
    "openai": "sk-proj-" + "Ab1" * 12,
    "github": "ghp_" + "Z9y8" * 10,
    "jwt": "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxMjM0NTY3ODkwIn0.dozjgNryP4J3jVmNHl0w5N_XgL0n3I9PlFUP0THsR8U",
    "aws": "AKIA" + "ABCDEFGHIJKLMNOP",
    "pem_body": "MIIEowIBAAKCAQEAuXbC7fGhIjKlMnOpQrStUvWxYz0123456789abcdefghij",
}
PEM = ("-----BEGIN RSA PRIVATE KEY-----\n" + SECRETS["pem_body"] +
       "\nQWERTYUIOPASDFGHJKLZXCVBNMqwertyuiopasdfghjklzxcvbnm0123456789\n-----END RSA PRIVATE KEY-----\n")

T_AGENT = ms("2030-03-01T10:00:00Z")
T_LIST = ms("2031-01-01T00:00:00Z")
T_LABEL = ms("2032-01-01T00:00:00Z")
T_SNIP = ms("2033-01-01T00:00:00Z")
T_TIE = ms("2034-01-01T00:00:00Z")
T_MISC = ms("2035-01-01T00:00:00Z")
T_1978 = 274373158084            # 1978-09-11T14:45:58.084Z
AGENT = "claude-code:contract-agent"
MEMORY = "contract-memory-chat"


class Shared:
    def __init__(self, lab: Lab, d: Daemon) -> None:
        self.lab, self.d = lab, d
        self.ev: dict[str, dict] = {}     # name -> imported message
        self.imports: dict[str, dict] = {}


def _agent_session(s: Shared) -> None:
    """A preamble system event, then three turns (the last incomplete), tools in a known order."""
    t = T_AGENT
    rows = [
        ("pre", "system", "session started (compaction marker)", {}),
        ("u1", "user_input", "why does the gateway return 502 in staging?", {}),
        ("r1", "reasoning", H.ENCRYPTED_REASONING, {"model": "claude-x"}),
        ("c1", "tool_call", json.dumps({"file_path": "/srv/gw/nginx.conf"}), {"tool_name": "Read", "model": "claude-x"}),
        ("o1", "tool_response", "proxy_read_timeout 5s;", {"tool_name": "Read", "is_error": False}),
        ("c2", "tool_call", json.dumps({"command": "curl -sI gw"}), {"tool_name": "Bash", "model": "claude-x"}),
        ("o2", "tool_response", "HTTP/1.1 502 Bad Gateway", {"tool_name": "Bash", "is_error": True, "exit_code": 7}),
        ("c3", "tool_call", json.dumps({"file_path": "/srv/gw/upstream.conf"}), {"tool_name": "Read"}),
        ("o3", "tool_response", "server app:8080;", {"tool_name": "Read"}),
        ("a1", "assistant_response", "The gateway times out after 5s: raise proxy_read_timeout.", {"model": "claude-x"}),
        ("u2", "user_input", "and the retry budget?", {}),
        ("a2", "assistant_response", "Keep two retries with jitter for the gateway.", {"model": "claude-x"}),
        ("u3", "user_input", "apply it to prod as well", {}),
        ("c4", "tool_call", json.dumps({"command": "kubectl apply -f gw.yaml"}), {"tool_name": "Bash"}),
    ]
    msgs = []
    for i, (name, etype, content, extra) in enumerate(rows):
        m = ev(AGENT, etype, content, t + i * 1000, **extra)
        s.ev[name] = m
        msgs.append(m)
    put(s.d, msgs, [{"session_id": AGENT, "harness": "claude-code", "source": "claude", "title": "Gateway 502",
                     "cwd": "/srv/gw"}])


def _memory_session(s: Shared) -> None:
    with s.d.client() as c:
        for role, text in (("system", "be terse"), ("user", "remember the deploy window is friday"),
                           ("assistant", "noted: deploys on friday"), ("user", "and the freeze?")):
            c.write(MEMORY, text, role=role)


def _list_sessions(s: Shared) -> None:
    t = T_LIST
    msgs = [ev("list-A", "user_input", "a1", t + 1000), ev("list-A", "assistant_response", "a2", t + 5000),
            ev("list-B", "user_input", "b1", t + 5000), ev("list-B", "tool_call", "{}", t + 9000, tool_name="WebSearch"),
            ev("list-C", "user_input", "c1", t + 9000)]
    put(s.d, msgs, [{"session_id": "list-A", "harness": "codex", "source": "codex"},
                    {"session_id": "list-B", "harness": "claude-code", "source": "claude-subagents"},
                    {"session_id": "list-C", "harness": "claude-code", "source": "claude"}])


def _labels(s: Shared) -> None:
    metas = [
        {"session_id": "label-1", "harness": "codex", "source": "codex", "first_prompt": "\n  Fix the flaky test  \nmore"},
        {"session_id": "label-2", "harness": "codex", "source": "codex", "first_prompt": "x" * 119 + "é" + "TAIL"},
        {"session_id": "label-3", "harness": "codex", "source": "codex", "first_prompt": "y" * 120},
        {"session_id": "label-4", "harness": "codex", "source": "codex", "first_prompt": "p", "title": "Explicit"},
        {"session_id": "label-5", "harness": "codex", "source": "codex", "summary": "a summary here", "slug": "s-x"},
        {"session_id": "label-6", "harness": "claude-code", "source": "claude", "first_prompt": "never a label"},
        {"session_id": "label-7", "harness": "claude-code", "source": "claude", "slug": "happy-otter"},
    ]
    put(s.d, [ev(m["session_id"], "user_input", "hello", T_LABEL + i * 1000) for i, m in enumerate(metas)], metas)


def _snippets(s: Shared) -> None:
    sid = "claude-code:snippets"
    big = ("lorem ipsum dolor sit amet " * 19000) + " the ZQNEEDLEWORD appears here once " + ("tail words " * 2000)
    jp = ("これは日本語の長い文章です。" * 3000) + "データベース移行が失敗しました" + ("。続きの文章" * 500)
    fw = ("filler text " * 5000) + "ＦＵＬＬＷＩＤＴＨ　ｚｑｍａｔｃｈ" + (" more" * 1000)
    mixed = ("abc " * 20000) + "ZqMiXeDCaSe Token" + (" def" * 100)
    rows = [("s_u", "user_input", "zqshowlogs show me the logs", {}), ("s_big", "tool_response", big, {"tool_name": "Bash"}),
            ("s_jp", "tool_response", jp, {"tool_name": "Bash"}), ("s_fw", "tool_response", fw, {"tool_name": "Bash"}),
            ("s_mx", "tool_response", mixed, {"tool_name": "Bash"})]
    msgs = []
    for i, (name, etype, content, extra) in enumerate(rows):
        s.ev[name] = m = ev(sid, etype, content, T_SNIP + i * 1000, **extra)
        msgs.append(m)
    put(s.d, msgs)


def _secrets_transcript(s: Shared) -> None:
    base = s.lab.base / "secret-claude"
    sid = "bbbbbbbb-0000-4000-8000-00000000beef"
    cwd = s.lab.base
    lines = [json.dumps({"type": "summary", "summary": f"rotate key {SECRETS['github']}", "leafUuid": "x"}),
             claude_line(sid, str(cwd), "00000000-0000-4000-8000-00000000b001", "2026-01-05T00:00:00.000Z", "user",
                         f"my key is {SECRETS['openai']} please use it"),
             claude_line(sid, str(cwd), "00000000-0000-4000-8000-00000000b002", "2026-01-05T00:00:01.000Z",
                         "assistant", [{"type": "tool_use", "id": "tb1", "name": "Bash", "input": {
                             "command": f"curl -H 'Authorization: Bearer {SECRETS['jwt']}' https://x"}}], model="m"),
             claude_line(sid, str(cwd), "00000000-0000-4000-8000-00000000b003", "2026-01-05T00:00:02.000Z", "user",
                         [{"type": "tool_result", "tool_use_id": "tb1", "content": PEM + f"\naws {SECRETS['aws']}"}]),
             claude_line(sid, str(cwd), "00000000-0000-4000-8000-00000000b004", "2026-01-05T00:00:03.000Z",
                         "assistant", [{"type": "tool_use", "id": "tb2", "name": "Write",
                                        "input": {"file_path": str(cwd / "id_rsa"), "content": PEM}}], model="m"),
             claude_line(sid, str(cwd), "00000000-0000-4000-8000-00000000b005", "2026-01-05T00:00:04.000Z", "user",
                         [{"type": "tool_result", "tool_use_id": "tb2", "content": "ok"}])]
    p = base / "proj" / f"{sid}.jsonl"
    p.parent.mkdir(parents=True)
    p.write_text("\n".join(lines) + "\n")
    s.imports["secrets"] = import_transcripts(s.lab, s.d, "claude-code", base)


def _misc(s: Shared) -> None:
    t = T_MISC
    # a final answer followed by a compaction marker (the codex fixture has exactly this)
    s.ev["cm_u"] = ev("claude-code:compacted", "user_input", "zqcompact question", t)
    s.ev["cm_a"] = ev("claude-code:compacted", "assistant_response", "zqcompact final answer", t + 1000)
    s.ev["cm_s"] = ev("claude-code:compacted", "system", "[conversation compacted]", t + 2000)
    # two turns, for traversal at the turn boundary
    s.ev["tb_u1"] = ev("claude-code:boundary", "user_input", "zqboundary one", t + 3000)
    s.ev["tb_a1"] = ev("claude-code:boundary", "assistant_response", "zqboundary answer one", t + 4000)
    s.ev["tb_u2"] = ev("claude-code:boundary", "user_input", "zqboundary two", t + 5000)
    s.ev["tb_a2"] = ev("claude-code:boundary", "assistant_response", "zqboundary answer two", t + 6000)
    # German text whose case folding lengthens it (ß -> ss) before the match
    german = ("Die Straße ist groß und heiß. " * 500) + "Der Fehler: Verbindungsabbruch beim Datenbankzugriff. " + \
             ("The rest of the log is plain text. " * 500)
    s.ev["de"] = ev("claude-code:german", "tool_response", german, t + 7000, tool_name="Read")
    # a touch in 1978 (millisecond window edges)
    s.ev["old"] = ev("claude-code:old", "tool_call", json.dumps({"file_path": "/zq/old/file.py"}), T_1978,
                     tool_name="Edit", files=[{"path": "/zq/old/file.py", "root": None, "tail": None,
                                               "project": None, "op": "edit"}])
    # one file touched under a known root and, by a relative path without any cwd, under no provable root
    s.ev["kr"] = ev("claude-code:roots", "tool_call", "{}", t + 8000, tool_name="Edit", files=[
        {"path": "/zq/proj/zq/unknown.py", "root": "/zq/proj", "tail": "zq/unknown.py", "project": "/zq/proj/.git",
         "op": "edit"}])
    s.ev["ur"] = ev("claude-code:roots", "tool_call", "{}", t + 9000, tool_name="Read", files=[
        {"path": "zq/unknown.py", "root": None, "tail": None, "project": None, "op": "read"}])
    put(s.d, [s.ev[k] for k in ("cm_u", "cm_a", "cm_s", "tb_u1", "tb_a1", "tb_u2", "tb_a2", "de", "old", "kr", "ur")])
    # ties: identical text, identical time, in separate sessions, created in an order unlike their ids
    rng = random.Random(5)
    tie = [ev(f"tie-{i}", "user_input", "identical zqzebraquagga content", T_TIE) for i in range(12)]
    rng.shuffle(tie)
    put(s.d, tie + [ev("tie-new", "user_input", "identical zqzebraquagga content", T_TIE + 5000),
                    ev("tie-old", "user_input", "identical zqzebraquagga content", T_TIE - 5000)])


@pytest.fixture(scope="module")
def shared() -> Iterator[Shared]:
    with lab_ctx("hcs") as lab:
        d = lab.daemon()
        s = Shared(lab, d)
        _agent_session(s)
        _memory_session(s)
        _list_sessions(s)
        _labels(s)
        _snippets(s)
        _misc(s)
        s.imports["claude"] = import_transcripts(lab, d, "claude-code", FIXTURES / "claude" / "projects")
        s.imports["codex"] = import_transcripts(lab, d, "codex", FIXTURES / "codex" / "sessions")
        _secrets_transcript(s)
        yield s


# =================================================================================== input validation
def test_validation_matrix(shared: Shared) -> None:
    """Every edge of every tool's input: the code, the field named, and a message that never repeats
    the caller's value."""
    d = shared.d
    hits = find(d, "gateway", within_id=None, event_types=ALL_TYPES)
    h = next(x for x in hits if x["event"]["type"] == "assistant_response")
    E, T, S = h["open"]["event_id"], h["open"]["turn_id"], h["open"]["session_id"]
    tokS, tokE, tokT = S.split(":", 1)[1], E.split(":", 1)[1], T.split(":", 1)[1]
    with lab_ctx("hcf") as other:   # ids and cursors of another store
        d2 = other.daemon()
        put(d2, [ev("x", "user_input", "gateway elsewhere", T_AGENT), ev("x", "assistant_response", "ok", T_AGENT + 1)])
        o = find(d2, "gateway")[0]["open"]
        FE, FT, FS = o["event_id"], o["turn_id"], o["session_id"]
        foreign_cursor = open_(d2, id=FS, limit=1)["next_cursor"] or ""
    mark = "zqMARKzq"
    cases: list[tuple[str, Any, str, str | None]] = [
        # search_sessions
        ("search_sessions", {}, "invalid_request", "query"),
        ("search_sessions", {"query": None}, "invalid_request", "query"),
        ("search_sessions", {"query": 5}, "invalid_request", "query"),
        ("search_sessions", {"query": "   "}, "invalid_request", "query"),
        ("search_sessions", {"query": "\u3000\t\n"}, "invalid_request", "query"),
        ("search_sessions", {"query": "a" * 4097}, "invalid_request", "query"),
        ("search_sessions", {"query": "a" * 4096}, "OK", None),
        ("search_sessions", {"query": "x", "within_id": ""}, "invalid_request", "within_id"),
        ("search_sessions", {"query": "x", "within_id": "  "}, "invalid_request", "within_id"),
        ("search_sessions", {"query": "x", "within_id": 5}, "invalid_request", "within_id"),
        ("search_sessions", {"query": "x", "within_id": mark}, "invalid_id", "within_id"),
        ("search_sessions", {"query": "x", "within_id": "session:"}, "invalid_id", "within_id"),
        ("search_sessions", {"query": "x", "within_id": E}, "invalid_request", "within_id"),
        ("search_sessions", {"query": "x", "within_id": FS}, "invalid_id", "within_id"),
        ("search_sessions", {"query": "x", "within_id": FT}, "invalid_id", "within_id"),
        ("search_sessions", {"query": "x", "within_id": "turn:" + tokS}, "invalid_id", "within_id"),
        ("search_sessions", {"query": "x", "within_id": "session:" + tokT}, "invalid_id", "within_id"),
        ("search_sessions", {"query": "x", "within_id": S + " "}, "invalid_id", "within_id"),
        ("search_sessions", {"query": "x", "within_id": S.upper()}, "invalid_id", "within_id"),
        ("search_sessions", {"query": "x", "event_types": []}, "invalid_request", "event_types"),
        ("search_sessions", {"query": "x", "event_types": "user_input"}, "invalid_request", "event_types"),
        ("search_sessions", {"query": "x", "event_types": ["user_input", "debug_trace"]}, "unsupported_event_type",
         "event_types"),
        ("search_sessions", {"query": "x", "event_types": ["USER_INPUT"]}, "unsupported_event_type", "event_types"),
        ("search_sessions", {"query": "x", "event_types": ["unknown"]}, "unsupported_event_type", "event_types"),
        ("search_sessions", {"query": "x", "event_types": [None]}, "unsupported_event_type", "event_types"),
        ("search_sessions", {"query": "x", "n_hits": 0}, "invalid_request", "n_hits"),
        ("search_sessions", {"query": "x", "n_hits": 51}, "invalid_request", "n_hits"),
        ("search_sessions", {"query": "x", "n_hits": 1.5}, "invalid_request", "n_hits"),
        ("search_sessions", {"query": "x", "n_hits": "5"}, "invalid_request", "n_hits"),
        ("search_sessions", {"query": "x", "n_hits": True}, "invalid_request", "n_hits"),
        ("search_sessions", {"query": "x", "n_hits": float("nan")}, "invalid_request", "n_hits"),
        ("search_sessions", {"query": "x", "n_hits": 50}, "OK", None),
        ("search_sessions", {"query": "x", "harness": ""}, "invalid_request", "harness"),
        ("search_sessions", {"query": "x", "harness": "\t "}, "invalid_request", "harness"),
        ("search_sessions", {"query": "x", "source": "\u3000"}, "invalid_request", "source"),
        ("search_sessions", {"query": "x", "source": ["claude"]}, "invalid_request", "source"),
        ("search_sessions", {"query": "x", "bogus": mark}, "invalid_request", "bogus"),
        ("search_sessions", {"query": "x", "within_id": None, "event_types": None, "harness": None, "source": None,
                             "n_hits": None}, "OK", None),
        # open
        ("open", {}, "invalid_request", "id"),
        ("open", {"id": None}, "invalid_request", "id"),
        ("open", {"id": ""}, "invalid_request", "id"),
        ("open", {"id": " \t"}, "invalid_request", "id"),
        ("open", {"id": 7}, "invalid_request", "id"),
        ("open", {"id": mark}, "invalid_id", "id"),
        ("open", {"id": "event:" + mark + mark}, "invalid_id", "id"),
        ("open", {"id": FE}, "invalid_id", "id"),
        ("open", {"id": FT}, "invalid_id", "id"),
        ("open", {"id": FS}, "invalid_id", "id"),
        ("open", {"id": "event:" + tokT}, "invalid_id", "id"),
        ("open", {"id": "turn:" + tokS}, "invalid_id", "id"),
        ("open", {"id": "session:" + tokE}, "invalid_id", "id"),
        ("open", {"id": E, "limit": 5}, "invalid_request", "limit"),
        ("open", {"id": E, "limit": None, "cursor": None}, "OK", None),
        ("open", {"id": T, "limit": 0}, "invalid_request", "limit"),
        ("open", {"id": T, "limit": 101}, "invalid_request", "limit"),
        ("open", {"id": T, "limit": 2.5}, "invalid_request", "limit"),
        ("open", {"id": T, "limit": "2"}, "invalid_request", "limit"),
        ("open", {"id": T, "limit": False}, "invalid_request", "limit"),
        ("open", {"id": T, "limit": 100}, "OK", None),
        ("open", {"limit": 3}, "invalid_request", "limit"),
        ("open", {"cursor": ""}, "invalid_request", "cursor"),
        ("open", {"cursor": mark}, "invalid_request", "cursor"),
        ("open", {"cursor": foreign_cursor}, "invalid_request", "cursor"),
        ("open", {"cursor": mark, "id": T}, "invalid_request", "cursor"),
        ("open", {"cursor": mark, "limit": 2}, "invalid_request", "cursor"),
        ("open", {"id": T, "extra": None}, "invalid_request", "extra"),
        # list_sessions
        ("list_sessions", {}, "invalid_request", "start_datetime"),
        ("list_sessions", {"start_datetime": WIDE[0]}, "invalid_request", "end_datetime"),
        ("list_sessions", {"start_datetime": "2026-01-01T00:00:00", "end_datetime": WIDE[1]}, "invalid_request",
         "start_datetime"),
        ("list_sessions", {"start_datetime": "2026-01-01", "end_datetime": WIDE[1]}, "invalid_request",
         "start_datetime"),
        ("list_sessions", {"start_datetime": " " + WIDE[0], "end_datetime": WIDE[1]}, "invalid_request",
         "start_datetime"),
        ("list_sessions", {"start_datetime": 1767225600000, "end_datetime": WIDE[1]}, "invalid_request",
         "start_datetime"),
        ("list_sessions", {"start_datetime": mark, "end_datetime": WIDE[1]}, "invalid_request", "start_datetime"),
        ("list_sessions", {"start_datetime": WIDE[0], "end_datetime": WIDE[0]}, "invalid_request", "end_datetime"),
        ("list_sessions", {"start_datetime": WIDE[1], "end_datetime": WIDE[0]}, "invalid_request", "end_datetime"),
        ("list_sessions", {"start_datetime": WIDE[0], "end_datetime": WIDE[1], "mode": mark}, "invalid_request",
         "mode"),
        ("list_sessions", {"start_datetime": WIDE[0], "end_datetime": WIDE[1], "sort": "DESC"}, "invalid_request",
         "sort"),
        ("list_sessions", {"start_datetime": WIDE[0], "end_datetime": WIDE[1], "limit": 0}, "invalid_request", "limit"),
        ("list_sessions", {"start_datetime": WIDE[0], "end_datetime": WIDE[1], "limit": 101}, "invalid_request",
         "limit"),
        ("list_sessions", {"start_datetime": WIDE[0], "end_datetime": WIDE[1], "cursor": mark}, "invalid_request",
         "cursor"),
        ("list_sessions", {"start_datetime": WIDE[0], "end_datetime": WIDE[1], "harness": " "}, "invalid_request",
         "harness"),
        ("list_sessions", {"start_datetime": WIDE[0], "end_datetime": WIDE[1], "unknown": 1}, "invalid_request",
         "unknown"),
        ("list_sessions", {"start_datetime": "2026-01-01T09:00:00+09:00", "end_datetime": WIDE[1], "limit": None,
                           "cursor": None, "mode": None, "harness": None, "source": None, "sort": None}, "OK", None),
        # file_attention (no launch context from the socket: scope project must fail closed)
        ("file_attention", {}, "invalid_request", "path"),
        ("file_attention", {"path": ""}, "invalid_request", "path"),
        ("file_attention", {"path": "  "}, "invalid_request", "path"),
        ("file_attention", {"path": " a.py"}, "invalid_request", "path"),
        ("file_attention", {"path": "a.py "}, "invalid_request", "path"),
        ("file_attention", {"path": mark + "/"}, "invalid_request", "path"),
        ("file_attention", {"path": "file:///" + mark}, "invalid_request", "path"),
        ("file_attention", {"path": "a\nb"}, "invalid_request", "path"),
        ("file_attention", {"path": "/a/b.py"}, "invalid_request", "scope"),
        ("file_attention", {"path": "/a/b.py", "scope": "ALL"}, "invalid_request", "scope"),
        ("file_attention", {"path": "/a/b.py", "scope": "all", "granularity": "turns"}, "invalid_request",
         "granularity"),
        ("file_attention", {"path": "/a/b.py", "scope": "all", "start_datetime": "2026-01-01T00:00:00.1234Z"},
         "invalid_request", "start_datetime"),
        ("file_attention", {"path": "/a/b.py", "scope": "all", "end_datetime": "2026-01-01T00:00:00"},
         "invalid_request", "end_datetime"),
        ("file_attention", {"path": "/a/b.py", "scope": "all", "start_datetime": "2026-01-01T00:00:01Z",
                            "end_datetime": "2026-01-01T00:00:01Z"}, "invalid_request", "end_datetime"),
        ("file_attention", {"path": "/a/b.py", "scope": "all", "mutations_only": "true"}, "invalid_request",
         "mutations_only"),
        ("file_attention", {"path": "/a/b.py", "scope": "all", "mutations_only": 0}, "invalid_request",
         "mutations_only"),
        ("file_attention", {"path": "/a/b.py", "scope": "all", "tool": ""}, "invalid_request", "tool"),
        ("file_attention", {"path": "/a/b.py", "scope": "all", "limit": 101}, "invalid_request", "limit"),
        ("file_attention", {"path": "/a/b.py", "scope": "all", "start_datetime": "2026-01-01T00:00:00.123Z",
                            "end_datetime": None, "tool": None, "harness": None, "source": None,
                            "mutations_only": None, "limit": None, "granularity": None}, "OK", None),
        # get_ingest_status
        ("get_ingest_status", {}, "OK", None),
        ("get_ingest_status", {"verbose": True}, "invalid_request", None),
    ]
    problems = []
    for op, args, code, field in cases:
        rep = call(d, op, args)
        got = "OK" if rep.get("status") == "OK" else rep.get("error", {}).get("code")
        if got != code:
            problems.append(f"{op} {json.dumps(args)[:120]}: expected {code}, got {got}: {str(rep)[:200]}")
            continue
        if code == "OK":
            assert set(rep) == {"status", "request", "data", "warnings"}
            continue
        err = rep["error"]
        assert set(err) >= {"code", "message", "details"} and isinstance(err["message"], str) and err["message"]
        if field is not None and err["details"].get("field") != field:
            problems.append(f"{op} {json.dumps(args)[:120]}: details.field {err['details'].get('field')!r} != {field}")
        if mark in err["message"] or mark in json.dumps(err["details"]):
            problems.append(f"{op}: the error repeats the caller's value: {err['message']}")
    assert not problems, "\n".join(problems)


def test_canonical_requests(shared: Shared) -> None:
    d = shared.d
    rep = call(d, "search_sessions", {"query": "  gateway timeout \n", "event_types": [
        "tool_response", "user_input", "tool_response", "system", "reasoning"]})
    assert rep["request"] == {"query": "gateway timeout", "within_id": None,
                              "event_types": ["user_input", "reasoning", "tool_response", "system"],
                              "harness": None, "source": None, "n_hits": 10}
    assert rep["data"]["limit"] == 10
    rep = call(d, "list_sessions", {"start_datetime": WIDE[0], "end_datetime": WIDE[1]})
    assert rep["request"] == {"start_datetime": WIDE[0], "end_datetime": WIDE[1], "limit": 20, "cursor": None,
                              "mode": None, "harness": None, "source": None, "sort": "desc"}
    rep = call(d, "file_attention", {"path": "/zq/old/file.py", "scope": "all"})
    assert rep["request"] == {"path": "/zq/old/file.py", "scope": "all", "granularity": "sessions",
                              "start_datetime": None, "end_datetime": None, "tool": None, "harness": None,
                              "source": None, "mutations_only": False, "limit": 50}
    sid = agent_sid(d)
    assert call(d, "open", {"id": sid, "limit": None})["request"] == {"id": sid}
    assert call(d, "open", {"id": sid, "limit": 3.0})["request"] == {"id": sid, "limit": 3}
    assert call(d, "get_ingest_status", None)["request"] == {}


# =================================================================================== the record model
def test_agent_session_turns_events_and_traversal(shared: Shared) -> None:
    d = shared.d
    hits = find(d, "gateway", event_types=ALL_TYPES, n_hits=50)
    by_text = {h["snippet"]["text"]: h for h in hits}
    a1 = by_text["The gateway times out after 5s: raise proxy_read_timeout."]
    # the search hit's facts
    assert a1["id"] == a1["event"]["id"] == a1["open"]["event_id"]
    assert a1["event"]["type"] == "assistant_response" and a1["event"]["terminal"] is True
    assert a1["event"]["ordinal"] == 9 and a1["turn"]["ordinal"] == 2 and a1["turn"]["event_count"] == 9
    assert a1["turn"]["completed"] is True
    assert a1["session"]["title"] == "Gateway 502" and a1["session"]["harness"] == "claude-code"
    assert a1["session"]["source"] == "claude" and a1["session"]["completed"] is False   # last turn incomplete
    assert a1["session"]["started_at"] == iso_ms(T_AGENT) and a1["session"]["updated_at"] == iso_ms(T_AGENT + 13000)
    for h in hits:
        assert 0.0 <= h["score"] <= 1.0
    scores = [h["score"] for h in hits]
    assert scores == sorted(scores, reverse=True)

    session = open_(d, id=a1["open"]["session_id"])
    assert session["kind"] == "session" and session["turns"] == [] and session["next_cursor"] is None
    assert session["session"]["turn_count"] == 4 and session["session"]["event_count"] == 14
    assert session["session"]["mode"] == "tool_calling" and session["session"]["cwd"] == "/srv/gw"
    turns = open_(d, id=a1["open"]["session_id"], limit=10)["turns"]
    assert [t["ordinal"] for t in turns] == [1, 2, 3, 4]
    pre, t1, t2, t3 = turns
    assert pre["user_input"] is None and pre["event_types"] == ["system"] and pre["completed"] is False
    assert t1["id"] == a1["open"]["turn_id"]
    assert t1["tools_called"] == ["Read", "Bash"]                      # unique, first-seen
    assert t1["event_types"] == ["user_input", "reasoning", "tool_call", "tool_response", "assistant_response"]
    assert t1["user_input"]["text"] == "why does the gateway return 502 in staging?"
    assert t1["final_response"]["event_id"] == t1["terminal_event_id"] == a1["id"]
    assert t1["open"] == {"turn_id": t1["id"], "terminal_event_id": a1["id"]}
    assert t3["completed"] is False and t3["final_response"] is None and t3["terminal_event_id"] is None
    assert session["traversal"]["first_turn_id"] == pre["id"] and session["traversal"]["last_turn_id"] == t3["id"]

    # id-only turn: summary, empty page; expanded: compact summaries with model and tool names
    turn = open_(d, id=t1["id"])
    assert turn["events"] == [] and turn["next_cursor"] is None
    assert turn["summary"]["tools_called"] == ["Read", "Bash"]
    assert turn["traversal"]["previous_turn_id"] == pre["id"] and turn["traversal"]["next_turn_id"] == t2["id"]
    events = open_(d, id=t1["id"], limit=100)["events"]
    assert [x["ordinal"] for x in events] == list(range(1, 10))
    assert [x["terminal"] for x in events] == [False] * 8 + [True]
    assert events[1]["summary"] == H.ENCRYPTED_REASONING and events[1]["model"] == "claude-x"
    assert events[2]["tool_name"] == "Read" and events[2]["summary"].startswith("Read ")
    assert turn["traversal"]["first_event_id"] == events[0]["id"] and turn["traversal"]["last_event_id"] == a1["id"]

    # every traversal id is openable, and null only at the session's ends
    first = open_(d, id=pre["id"])
    assert first["traversal"]["previous_turn_id"] is None
    last = open_(d, id=t3["id"])
    assert last["traversal"]["next_turn_id"] is None
    call_ev = open_(d, id=events[2]["id"])
    assert call_ev["content"] == {"format": "tool_call", "tool_name": "Read",
                                  "arguments": {"file_path": "/srv/gw/nginx.conf"},
                                  "text": 'Read({"file_path": "/srv/gw/nginx.conf"})', "truncated": False}
    assert call_ev["event"]["turn_id"] == t1["id"] and call_ev["event"]["session_id"] == a1["open"]["session_id"]
    assert call_ev["event"]["originating_model"] == "claude-x"
    bash_out = open_(d, id=events[5]["id"])
    assert bash_out["content"]["is_error"] is True and bash_out["content"]["exit_code"] == 7
    assert bash_out["content"]["text"] == "HTTP/1.1 502 Bad Gateway"
    for key in ("previous_event_id", "next_event_id", "previous_turn_id", "next_turn_id", "turn_id", "session_id"):
        ref = call_ev["traversal"][key]
        assert ref is not None and call(d, "open", {"id": ref})["status"] == "OK", key
    reasoning = open_(d, id=events[1]["id"])
    assert reasoning["content"]["format"] == "reasoning" and reasoning["content"]["encrypted"] is True
    # within_id narrows to the turn, and to the session
    in_turn = find(d, "gateway", within_id=t1["id"], event_types=ALL_TYPES)
    assert in_turn and all(h["open"]["turn_id"] == t1["id"] for h in in_turn)
    in_session = find(d, "gateway", within_id=a1["open"]["session_id"], event_types=ALL_TYPES, n_hits=50)
    assert {h["open"]["session_id"] for h in in_session} == {a1["open"]["session_id"]}
    assert find(d, "zqnothing", within_id=t1["id"]) == []


def test_file_attention_unknown_roots_are_counted_and_warned(shared: Shared) -> None:
    rep = call(shared.d, "file_attention", {"path": "zq/unknown.py", "scope": "all", "granularity": "events"})
    data = ok(rep)
    sm = data["summary"]
    assert sm["total_touches"] == 2 and sm["unknown_root_touches"] == 1 and sm["distinct_known_roots"] == 1
    assert sm["distinct_roots"] == 2 and sm["ambiguous"] is True
    assert [r["root"] for r in data["roots"]] == ["/zq/proj"]
    assert [e["event"]["match_kind"] for e in data["events"]] == ["path_suffix", "path_tail"]
    assert any(w.startswith("unknown_roots") for w in rep["warnings"])
    assert sm["first_touch"] == iso_ms(T_MISC + 8000) and sm["last_touch"] == iso_ms(T_MISC + 9000)
    one = ok(call(shared.d, "file_attention", {"path": "zq/unknown.py", "scope": "all", "mutations_only": True}))
    assert one["summary"]["total_touches"] == 1 and one["sessions"][0]["session"]["ops"] == ["edit"]


def test_written_messages_are_events(shared: Shared) -> None:
    d = shared.d
    hits = find(d, "deploy window friday", harness="convmem", source="memory")
    assert hits and {h["session"]["harness"] for h in hits} == {"convmem"}
    sid = hits[0]["open"]["session_id"]
    s = open_(d, id=sid, limit=10)
    assert s["session"]["title"] == MEMORY and s["session"]["memory_session_id"] == MEMORY
    assert s["session"]["mode"] == "chat" and s["session"]["turn_count"] == 3 and s["session"]["event_count"] == 4
    pre, t1, t2 = s["turns"]
    assert pre["event_types"] == ["system"] and pre["user_input"] is None
    assert t1["event_types"] == ["user_input", "assistant_response"] and t1["completed"] is True
    assert t1["final_response"]["text"] == "noted: deploys on friday"
    assert t2["completed"] is False and t2["final_response"] is None
    assert find(d, "deploy window friday", harness="claude-code") == []
    # the memory family still reads the same data, unchanged
    with d.client() as c:
        hist = c.history(MEMORY)
    assert [m["role"] for m in hist] == ["system", "user", "assistant", "user"]


def test_list_sessions_window_sort_filters_and_cursor(shared: Shared) -> None:
    d = shared.d
    t = T_LIST

    def names(start: int, end: int, **kw: Any) -> list[str]:
        data = ok(call(d, "list_sessions", {"start_datetime": iso_ms(start), "end_datetime": iso_ms(end), **kw}))
        out = []
        for item in data["sessions"]:
            assert item["id"] == item["session"]["id"] == item["open"]["session_id"]
            out.append(item["session"]["memory_session_id"])
        return out

    # A: [1000, 5000], B: [5000, 9000], C: [9000, 9000]; updated_at >= start and started_at < end
    assert names(t + 5000, t + 9000) == ["list-B", "list-A"]
    assert names(t + 5001, t + 9001) == ["list-C", "list-B"]
    assert names(t, t + 1000) == []
    assert names(t, t + 1001) == ["list-A"]
    assert names(t + 9001, t + 10 ** 6) == []
    assert names(t, t + 10 ** 6, sort="asc") == ["list-A", "list-B", "list-C"]
    assert names(t, t + 10 ** 6) == ["list-C", "list-B", "list-A"]
    assert names(t, t + 10 ** 6, harness="claude-code") == ["list-C", "list-B"]
    assert names(t, t + 10 ** 6, harness="claude-code", source="claude") == ["list-C"]
    assert names(t, t + 10 ** 6, harness="Claude-Code") == []
    assert names(t, t + 10 ** 6, mode="web_search") == ["list-B"]
    assert names(t, t + 10 ** 6, mode="chat") == ["list-C", "list-A"]
    item = ok(call(d, "list_sessions", {"start_datetime": iso_ms(t), "end_datetime": iso_ms(t + 1001)}))["sessions"][0]
    assert set(item["session"]) >= {"title", "display_label", "harness", "source", "started_at", "updated_at",
                                    "turn_count", "event_count", "mode", "completed"}
    assert item["session"]["started_at"] == iso_ms(t + 1000) and item["session"]["updated_at"] == iso_ms(t + 5000)
    # paging: every session once, ranks continue, a changed filter or sort invalidates the cursor
    args = {"start_datetime": iso_ms(t), "end_datetime": iso_ms(t + 10 ** 6), "limit": 1}
    page = ok(call(d, "list_sessions", args))
    seen, ranks = [page["sessions"][0]["session"]["memory_session_id"]], [1]
    first_cursor = cur = page["next_cursor"]
    assert page["truncated"] is True and cur
    while cur:
        page = ok(call(d, "list_sessions", {**args, "cursor": cur}))
        seen += [x["session"]["memory_session_id"] for x in page["sessions"]]
        ranks += [x["rank"] for x in page["sessions"]]
        cur = page["next_cursor"]
    assert seen == ["list-C", "list-B", "list-A"] and ranks == [1, 2, 3]
    for change in ({"sort": "asc"}, {"harness": "claude-code"}, {"source": "claude"}, {"mode": "chat"},
                   {"end_datetime": iso_ms(t + 10 ** 6 + 1)}):
        rep = call(d, "list_sessions", {**args, **change, "cursor": first_cursor})
        assert rep["status"] == "ERROR" and rep["error"]["code"] == "invalid_request", change
    # an open cursor is not a listing cursor, and the reverse
    open_cursor = open_(d, id=agent_sid(d), limit=1)["next_cursor"]
    assert call(d, "list_sessions", {**args, "cursor": open_cursor})["error"]["code"] == "invalid_request"
    assert call(d, "open", {"cursor": first_cursor})["error"]["code"] == "invalid_request"


def test_display_label_rules(shared: Shared) -> None:
    d = shared.d
    data = ok(call(d, "list_sessions", {"start_datetime": iso_ms(T_LABEL), "end_datetime": iso_ms(T_LABEL + 10 ** 6),
                                        "sort": "asc"}))
    labels = [x["session"]["display_label"] for x in data["sessions"]]
    assert labels[0] == "Fix the flaky test"                       # first line, trimmed
    assert labels[1] == "x" * 119 + "é" + "…"                      # 120 scalar values plus an ellipsis
    assert labels[2] == "y" * 120                                  # exactly 120: no ellipsis
    assert labels[3] == "Explicit"                                 # an explicit title wins
    assert labels[4] == "a summary here"                           # then summary / slug
    assert labels[5] == "claude-code chat session, updated 2032-01-01 00:00 UTC, 1 turn"   # only Codex prompts
    assert labels[6] == "happy-otter"
    # no transcript text in a listing beyond the label
    assert "hello" not in json.dumps(data)


def agent_sid(d: Daemon) -> str:
    return find(d, "retry budget")[0]["open"]["session_id"]


def test_open_paging_every_child_exactly_once_and_cursor_binding(shared: Shared) -> None:
    d = shared.d
    sid = agent_sid(d)
    all_turns = [t["id"] for t in open_(d, id=sid, limit=100)["turns"]]
    for limit in (1, 2, 3, 4, 5):
        page = open_(d, id=sid, limit=limit)
        got = [t["id"] for t in page["turns"]]
        while page["next_cursor"]:
            rep = call(d, "open", {"cursor": page["next_cursor"]})
            assert rep["request"] == {"cursor": page["next_cursor"]}
            page = rep["data"]
            assert len(page["turns"]) <= limit          # the cursor keeps the page size
            got += [t["id"] for t in page["turns"]]
        assert got == all_turns, limit
    every_event = []
    for tid in all_turns:
        whole = [e["id"] for e in open_(d, id=tid, limit=100)["events"]]
        for limit in (1, 2, 4):
            page = open_(d, id=tid, limit=limit)
            got = [e["id"] for e in page["events"]]
            while page["next_cursor"]:
                page = open_(d, cursor=page["next_cursor"])
                got += [e["id"] for e in page["events"]]
            assert got == whole
        every_event += whole
    assert len(every_event) == len(set(every_event)) == 14
    # tampered cursors
    cursor = open_(d, id=sid, limit=1)["next_cursor"]
    for bad in (cursor[:-1], cursor + "A", cursor[:8] + ("B" if cursor[8] == "A" else "A") + cursor[9:]):
        assert call(d, "open", {"cursor": bad})["error"]["code"] == "invalid_request"


def test_stale_cursor_and_ids_across_rebuild_and_restart() -> None:
    with lab_ctx("hcm") as lab:
        d = lab.daemon()
        msgs = [ev("claude-code:m", t, f"{t} zqstale {i}", T_AGENT + i * 1000)
                for i, t in enumerate(["user_input", "assistant_response"] * 4)]
        put(d, msgs)
        hit = find(d, "zqstale", n_hits=1)[0]["open"]
        cursor = open_(d, id=hit["session_id"], limit=1)["next_cursor"]
        # an append at the end is not a change of what was paged: the cursor still serves
        put(d, [ev("claude-code:m", "user_input", "zqstale late", T_AGENT + 20_000)])
        assert call(d, "open", {"cursor": cursor})["status"] == "OK"
        with d.client() as c:
            assert c.call("delete_message", {"message_id": msgs[3]["message_id"]})["status"] == "OK"
        rep = call(d, "open", {"cursor": cursor})
        assert rep["error"]["code"] == "invalid_request" and rep["error"]["details"].get("reason") == "stale_cursor"
        assert "reopen" in rep["error"]["message"]
        ids = [hit["event_id"], hit["turn_id"], hit["session_id"]]
        before = [open_(d, id=i) for i in ids]
        with d.client() as c:
            assert c.rebuild()["status"] == "OK"
        d.kill()
        d.start()
        after = [open_(d, id=i) for i in ids]
        for a, b in zip(before, after):
            a.pop("coverage"), b.pop("coverage")
            assert a == b
        # a deleted event's id is then not_found: well-formed, names nothing; so is a vanished turn
        first_turn = open_(d, id=hit["session_id"], limit=1)["turns"][0]["id"]
        with d.client() as c:
            assert c.call("delete_message", {"message_id": msgs[0]["message_id"]})["status"] == "OK"
        assert call(d, "open", {"id": first_turn})["error"]["code"] == "not_found"
        rep = call(d, "search_sessions", {"query": "zqstale", "within_id": first_turn})
        assert rep["error"]["code"] == "not_found" and rep["error"]["details"].get("field") == "within_id"
        hit = find(d, "zqstale", n_hits=1)[0]["open"]
        message_id = open_(d, id=hit["event_id"])["event"]["message_id"]
        with d.client() as c:
            assert c.call("delete_message", {"message_id": message_id})["status"] == "OK"
        assert call(d, "open", {"id": hit["event_id"]})["error"]["code"] == "not_found"


def test_snippets_are_bounded_and_around_the_match(shared: Shared) -> None:
    d = shared.d
    sid = find(d, "zqshowlogs")[0]["open"]["session_id"]
    for query, needle in (("zqneedleword", "zqneedleword"), ("データベース移行", "データベース移行"),
                          ("fullwidth zqmatch", "ｆｕｌｌｗｉｄｔｈ"), ("ＦＵＬＬＷＩＤＴＨ", "ｆｕｌｌｗｉｄｔｈ"),
                          ("zqmixedcase token", "zqmixedcase"), ("ZQMIXEDCASE", "zqmixedcase")):
        hits = find(d, query, within_id=sid, event_types=["tool_response"], n_hits=1)
        assert hits, query
        snip = hits[0]["snippet"]
        assert len(snip["text"]) <= H.SNIPPET_CHARS + 2 and snip["truncated"] is True, (query, snip)
        assert needle in snip["text"].lower(), (query, snip["text"])
    # a short message is its own snippet
    hit = find(d, "zqshowlogs", within_id=sid)[0]
    assert hit["snippet"] == {"text": "zqshowlogs show me the logs", "truncated": False}


# =================================================================================== ingestion
def test_transcripts_redaction_and_ingest_status(shared: Shared) -> None:
    d = shared.d
    assert shared.imports["secrets"]["redacted"] >= 5
    for secret in SECRETS.values():
        for h in find(d, secret, event_types=ALL_TYPES, n_hits=50):
            assert secret not in open_(d, id=h["id"])["content"]["text"]
        with d.client() as c:
            assert all(secret not in r["content"] for r in c.call("search_messages", {"query": secret})["results"])
    blob = b"".join(p.read_bytes() for p in Path(d.data_dir).rglob("*") if p.is_file())
    for secret in SECRETS.values():
        assert secret.encode() not in blob, "a secret reached the data directory"
    # the redacted tool call keeps its arguments as JSON
    hits = [h for h in find(d, "Authorization Bearer curl", event_types=["tool_call"]) if "curl -H" in h["snippet"]["text"]]
    args = open_(d, id=hits[0]["id"])["content"]["arguments"]
    assert args["command"] == "curl -H 'Authorization: Bearer [REDACTED:jwt]' https://x"
    status = ok(call(d, "get_ingest_status", {}))
    assert {c["condition_type"] for c in status["conditions"]} == {"health", "coverage", "freshness", "readiness"}
    for c in status["conditions"]:
        assert c["state"] in ("true", "false", "unknown") and c["reason"]
    claude = next(s for s in status["sources"] if s["source"] == "claude")
    assert claude["secrets_redacted"] >= 5 and status["secrets_redacted"] >= 5
    text = json.dumps(status)
    for leak in (str(FIXTURES), str(shared.lab.base), "/home/dev", ".jsonl", "Traceback"):
        assert leak not in text

    def strings(o: Any) -> Iterator[str]:
        if isinstance(o, str):
            yield o
        elif isinstance(o, dict):
            for k, v in o.items():
                yield k
                yield from strings(v)
        elif isinstance(o, list):
            for v in o:
                yield from strings(v)
    assert not [s for s in strings(status) if "/" in s], "get_ingest_status carries a path"


def test_fixture_transcripts_full_fidelity(shared: Shared) -> None:
    d = shared.d
    hits = find(d, "pytest", event_types=["tool_call"], harness="claude-code", n_hits=50)
    assert hits and all(h["event"]["tool_name"] for h in hits)
    out = find(d, "FAILED test_bulk_discount", event_types=["tool_response"], source="claude")
    assert out and open_(d, id=out[0]["id"])["content"]["format"] == "tool_response"
    labels = {x["session"]["display_label"] for x in ok(call(d, "list_sessions", {
        "start_datetime": "2025-01-01T00:00:00Z", "end_datetime": "2026-01-01T00:00:00Z", "harness": "codex"}))["sessions"]}
    assert "Add a --dry-run flag to the `inventory import` command, with a test." in labels
    enc = find(d, "omitted", event_types=["reasoning"], harness="codex")
    assert enc and open_(d, id=enc[0]["id"])["content"]["encrypted"] is True


def test_coverage_and_its_warnings() -> None:
    """data.coverage on search/list/open/file_attention, and the stable warnings when it is not complete."""
    with lab_ctx("hcc") as lab:
        d = lab.daemon()
        put(d, [ev("claude-code:cov", "user_input", "zqcoverage", T_AGENT)])
        sid = find(d, "zqcoverage")[0]["open"]["session_id"]
        calls = [("search_sessions", {"query": "zqcoverage"}), ("open", {"id": sid}),
                 ("list_sessions", {"start_datetime": WIDE[0], "end_datetime": WIDE[1]}),
                 ("file_attention", {"path": "/x/y.py", "scope": "all"})]

        def states() -> set[tuple[str, tuple[str, ...]]]:
            out = set()
            for op, args in calls:
                rep = call(d, op, args)
                out.add((rep["data"]["coverage"]["state"], tuple(w.split(":")[0] for w in rep["warnings"])))
            return out

        assert states() == {("complete", ())}
        put(d, [], checkpoints=[{"source": "claude", "key": "k1", "value": {"bytes": 1, "events": 1}}])
        assert states() == {("unknown", ("coverage_unknown",))}
        hb = {"instance": "i1", "started_at": T_AGENT, "interval_ms": 1000, "sources": [
            {"source": "claude", "harness": "claude-code", "discovery_complete": False, "files_total": 2,
             "files_completed": 1, "bytes_total": 10, "bytes_completed": 5}]}
        assert call(d, "ingest_heartbeat", hb)["status"] == "OK"
        assert states() == {("partial", ("coverage_partial",))}
        hb["sources"][0].update(discovery_complete=True, files_completed=2, bytes_completed=10)
        assert call(d, "ingest_heartbeat", hb)["status"] == "OK"
        assert states() == {("complete", ())}
        status = ok(call(d, "get_ingest_status", {}))
        assert status["current"]["progress"]["backlog_bytes"] == 0 and "rate" not in status and "eta" not in status


# =================================================================================== file_attention
class FaLab:
    def __init__(self, lab: Lab, d: Daemon) -> None:
        self.lab, self.d = lab, d
        b = lab.base
        self.repo, self.wt, self.other, self.plain = b / "repo", b / "wt-feat", b / "other", b / "plain"


@pytest.fixture(scope="module")
def fa() -> Iterator[FaLab]:
    """Two git repositories (one with a linked worktree), a non-git directory, and Claude Code transcripts
    that touch files in them, imported by the real CLI."""
    with lab_ctx("hca") as lab:
        d = lab.daemon()
        f = FaLab(lab, d)
        (f.repo / ".git" / "worktrees" / "feat").mkdir(parents=True)
        (f.repo / "src").mkdir()
        (f.repo / "src" / "app.py").write_text("x")
        (f.wt / "src").mkdir(parents=True)
        (f.wt / "src" / "app.py").write_text("x")
        (f.wt / ".git").write_text(f"gitdir: {f.repo}/.git/worktrees/feat\n")
        (f.repo / ".git" / "worktrees" / "feat" / "commondir").write_text("../..\n")
        (f.other / ".git").mkdir(parents=True)
        (f.other / "src").mkdir()
        (f.other / "src" / "app.py").write_text("x")
        (f.plain / "sub").mkdir(parents=True)
        (f.plain / "notes.txt").write_text("n")
        proj = lab.base / "claude" / "projects"
        claude_transcript(proj / "a" / "aaaaaaaa-0000-4000-8000-000000000001.jsonl",
                          "aaaaaaaa-0000-4000-8000-000000000001", f.repo, "edit the app", [
                              ("Edit", {"file_path": str(f.repo / "src" / "app.py"), "old_string": "a",
                                        "new_string": "b"}, "2026-02-01T00:00:01.000Z"),
                              ("Read", {"file_path": "src/app.py"}, "2026-02-01T00:00:02.500Z"),
                              ("Bash", {"command": f"cat {f.repo}/src/app.py && sed -i s/a/b/ src/app.py"},
                               "2026-02-01T00:00:03.000Z")])
        claude_transcript(proj / "b" / "aaaaaaaa-0000-4000-8000-000000000002.jsonl",
                          "aaaaaaaa-0000-4000-8000-000000000002", f.wt, "work in the worktree", [
                              ("Write", {"file_path": str(f.wt / "src" / "app.py"), "content": "z"},
                               "2026-02-01T00:00:04.000Z"),
                              ("Read", {"file_path": str(f.wt / "src" / "gone" / "deleted.py")},
                               "2026-02-01T00:00:05.000Z")])
        claude_transcript(proj / "c" / "aaaaaaaa-0000-4000-8000-000000000003.jsonl",
                          "aaaaaaaa-0000-4000-8000-000000000003", f.other, "the other repository", [
                              ("Edit", {"file_path": str(f.other / "src" / "app.py"), "old_string": "a",
                                        "new_string": "b"}, "2026-02-01T00:00:06.000Z")])
        claude_transcript(proj / "d" / "aaaaaaaa-0000-4000-8000-000000000004.jsonl",
                          "aaaaaaaa-0000-4000-8000-000000000004", f.plain, "notes", [
                              ("Edit", {"file_path": "notes.txt", "old_string": "a", "new_string": "b"},
                               "2026-02-01T00:00:07.000Z")])
        summary = import_transcripts(lab, d, "claude-code", proj)
        assert summary["imported"] > 0
        yield f


async def test_file_attention_identity_rules_over_stdio(fa: FaLab) -> None:
    repo, wt, other = fa.repo, fa.wt, fa.other
    async with mcp_client(fa.d.data_dir, fa.lab.home, repo) as c:
        async def run(args: dict) -> dict:
            env = await hcall(c, "file_attention", args)
            assert "error" not in env, env
            return env

        base = await run({"path": "src/app.py"})
        d = base["data"]
        assert d["tail"] == "src/app.py" and d["tail_is_absolute"] is False and d["scope"] == "project"
        assert d["summary"]["total_touches"] == 3 and d["summary"]["distinct_sessions"] == 2
        assert {r["root"]: r["touch_count"] for r in d["roots"]} == {str(repo): 2, str(wt): 1}
        assert d["summary"]["ambiguous"] is True and d["summary"]["distinct_known_roots"] == 2
        for row in d["sessions"]:
            assert row["id"] == row["open"]["session_id"] and row["session"]["harness"] == "claude-code"
            assert row["session"]["tools"] == sorted(row["session"]["tools"])
        # the same file named absolutely through the worktree, and from a subdirectory, is the same tail
        assert (await run({"path": str(wt / "src" / "app.py")}))["data"]["summary"]["total_touches"] == 3
        assert (await run({"path": "src/./app.py"}))["data"]["tail"] == "src/app.py"
        events = (await run({"path": "src/app.py", "granularity": "events"}))["data"]["events"]
        assert [(e["event"]["tool_name"], e["event"]["op"]) for e in events] == [
            ("Write", "write"), ("Read", "read"), ("Edit", "edit")]   # newest first; the shell `cat` is no touch
        for e in events:
            opened = await hcall(c, "open", {"id": e["open"]["event_id"]})
            assert opened["data"]["event"]["type"] == "tool_call"
            assert opened["data"]["event"]["session_id"] == e["open"]["session_id"] == e["event"]["session_id"]
            assert opened["data"]["event"]["turn_id"] == e["open"]["turn_id"]
            assert opened["data"]["event"]["timestamp"] == e["event"]["timestamp"]
        assert [e["event"]["tool_name"] for e in (await run({"path": "src/app.py", "tool": "EDIT",
                                                             "granularity": "events"}))["data"]["events"]] == ["Edit"]
        assert (await run({"path": "src/app.py", "mutations_only": True}))["data"]["summary"]["total_touches"] == 2
        window = {"path": "src/app.py", "granularity": "events", "start_datetime": "2026-02-01T00:00:02.500Z"}
        assert len((await run({**window, "end_datetime": "2026-02-01T00:00:04.000Z"}))["data"]["events"]) == 1
        assert len((await run({**window, "end_datetime": "2026-02-01T00:00:04.001Z"}))["data"]["events"]) == 2
        one = (await run({"path": "src/app.py", "granularity": "events", "limit": 1}))["data"]
        assert one["result_count"] == 1 and one["truncated"] is True and one["summary"]["total_touches"] == 3
        everywhere = (await run({"path": "src/app.py", "scope": "all"}))["data"]
        assert {r["root"] for r in everywhere["roots"]} == {str(repo), str(wt), str(other)}
        gone = (await run({"path": "src/gone/deleted.py"}))["data"]
        assert gone["summary"]["total_touches"] == 1 and [r["root"] for r in gone["roots"]] == [str(wt)]
        bare = await run({"path": "app.py"})
        assert bare["data"]["summary"]["ambiguous"] is True
        assert any(w.startswith("ambiguous_tail") for w in bare["warnings"])
        fresh = await c.call_tool("file_attention", {"path": "src/not_yet.py"})
        assert fresh.structured_content["data"]["summary"]["total_touches"] == 0
        assert "no recorded session touched" in fresh.content[0].text
    async with mcp_client(fa.d.data_dir, fa.lab.home, repo / "src") as c:
        d = (await hcall(c, "file_attention", {"path": "app.py"}))["data"]
        assert d["tail"] == "src/app.py" and d["summary"]["total_touches"] == 3
    async with mcp_client(fa.d.data_dir, fa.lab.home, fa.plain) as c:
        d = (await hcall(c, "file_attention", {"path": "notes.txt", "mutations_only": True}))["data"]
        assert d["summary"]["total_touches"] == 1
    async with mcp_client(fa.d.data_dir, fa.lab.home, fa.plain / "sub") as c:
        # without git the launch directory itself is the identity: a subdirectory is another project
        d = (await hcall(c, "file_attention", {"path": "../notes.txt"}))["data"]
        assert d["summary"]["total_touches"] == 0


# =================================================================================== MCP front-end
async def test_mcp_tools_envelopes_and_fuzz(shared: Shared) -> None:
    from mcp.shared.exceptions import MCPError

    d = shared.d
    async with mcp_client(d.data_dir, shared.lab.home, shared.lab.base) as c:
        tools = {t.name: t for t in (await c.list_tools()).tools}
        assert list(tools) == [*wire.TOOLS, *wire.HISTORY_TOOLS] and len(tools) == 12
        for name in wire.HISTORY_TOOLS:
            t = tools[name]
            assert t.annotations.read_only_hint is True and t.annotations.destructive_hint is False
            assert t.output_schema and t.input_schema["additionalProperties"] is False
        assert "search_messages" in tools["search_sessions"].description
        env = await hcall(c, "search_sessions", {"query": "gateway", "event_types": ALL_TYPES})
        r = await c.call_tool("search_sessions", {"query": "gateway", "event_types": ALL_TYPES})
        for hit in env["data"]["results"]:
            for handle in hit["open"].values():
                assert handle in r.content[0].text       # a text-only host still gets every id
        err = await hcall(c, "open", {"id": "event:" + "A" * 30, "zz_unknown": "zqSECRETzq"})
        assert err["error"]["code"] == "invalid_request" and "zqSECRETzq" not in json.dumps(err)
        err = await hcall(c, "search_sessions", {"query": "   "})
        assert err["request"] == {"query": "   "} and err["error"]["details"] == {"field": "query"}
        # a few hundred random calls: every one a well-formed envelope the SDK accepts against outputSchema
        ids = [v for h in env["data"]["results"] for v in h["open"].values()]
        rng = random.Random(3)
        values = [None, True, 0, -1, 2 ** 70, 1.5, "", " ", "x" * 20000, "日本", [], {}, {"a": [1, {"b": None}]},
                  ["user_input"] * 30, "2026-01-01T00:00:00Z", *ids[:6]]
        fields = {name: list(H.__dict__[f"{key}_FIELDS"]) for name, key in (
            ("search_sessions", "SEARCH"), ("open", "OPEN"), ("list_sessions", "LIST"), ("file_attention", "ATTENTION"))}
        fields["get_ingest_status"] = []
        base = {"search_sessions": {"query": "gateway"}, "open": {"id": ids[0]},
                "list_sessions": {"start_datetime": WIDE[0], "end_datetime": WIDE[1]},
                "file_attention": {"path": "/srv/gw/nginx.conf", "scope": "all"}, "get_ingest_status": {}}
        for _ in range(200):
            name = rng.choice(list(base))
            args = dict(base[name])
            for f in rng.sample(fields[name], min(len(fields[name]), rng.randrange(3))):
                args[f] = rng.choice(values)
            if rng.random() < 0.05:
                args["zz"] = rng.choice(values)
            r = await c.call_tool(name, args)
            assert r.is_error == ("error" in r.structured_content)
            assert r.structured_content["tool"] == name
        with pytest.raises(MCPError):
            await c.call_tool("no_such_tool", {})
    async with mcp_client(d.data_dir, shared.lab.home, shared.lab.base, "--tools", "history") as c:
        assert [t.name for t in (await c.list_tools()).tools] == list(wire.HISTORY_TOOLS)
        with pytest.raises(MCPError):
            await c.call_tool("search_messages", {"query": "x"})


def test_daemon_fuzz_history_tools(shared: Shared) -> None:
    """Thousands of mutated argument objects straight to the daemon's socket: every reply is a
    well-formed OK or error of this family, never internal_error, and the daemon still answers."""
    d = shared.d
    hits = find(d, "gateway", event_types=ALL_TYPES)
    ids = [v for h in hits for v in h["open"].values()]
    cursor = open_(d, id=hits[0]["open"]["session_id"], limit=1)["next_cursor"]
    rng = random.Random(7)
    fields = {"search_sessions": H.SEARCH_FIELDS, "open": H.OPEN_FIELDS, "list_sessions": H.LIST_FIELDS,
              "file_attention": H.ATTENTION_FIELDS, "get_ingest_status": ()}
    base = {"search_sessions": {"query": "gateway"}, "open": {"id": ids[0]},
            "list_sessions": {"start_datetime": WIDE[0], "end_datetime": WIDE[1]},
            "file_attention": {"path": "/srv/gw/nginx.conf", "scope": "all"}, "get_ingest_status": {}}

    def value(depth: int = 0) -> Any:
        k = rng.randrange(15)
        if k == 0:
            return None
        if k == 1:
            return rng.choice([True, False])
        if k == 2:
            return rng.choice([0, 1, -1, 50, 51, 100, 101, 2 ** 31, -2 ** 63, 2 ** 63 - 1])
        if k == 3:
            return rng.choice([0.5, 1.0, 1e308, -0.0, float("nan"), float("inf")])
        if k == 4:
            return rng.choice(["", " ", "\u3000", "\x00", "a" * 5000, "日本語", "\ufffd"])
        if k == 5:
            return rng.choice(ids + [cursor, cursor[:-1], "session:" + "A" * 200, "turn:AAAA", "event:" + "_" * 40])
        if k == 6:
            return rng.choice(["2026-01-01T00:00:00Z", "2026-01-01T00:00:00", "1969-12-31T23:59:59Z",
                               "9999-12-31T23:59:59.999Z", "2026-13-01T00:00:00Z", "T", "2026-01-01T00:00:00.1234567Z"])
        if k == 7:
            return rng.choice(["user_input", "tool_call", "system", "desc", "asc", "project", "all", "events",
                               "sessions", "chat", "web_search"])
        if k == 8 and depth < 3:
            return [value(depth + 1) for _ in range(rng.randrange(5))]
        if k == 9 and depth < 3:
            return {rng.choice(["a", "query", "id", ""]): value(depth + 1) for _ in range(rng.randrange(3))}
        if k == 10:
            return [rng.choice(ALL_TYPES) for _ in range(rng.randrange(30))]
        if k == 11:
            return rng.choice(["/srv/gw/nginx.conf", "a.py", "../x", "/", "//", "/r/a.py/", "file:///a", "C:\\x",
                               "~/x", "a\tb", "x" * 5000])
        if k == 12:
            return "".join(chr(rng.randrange(1, 0x3000)) for _ in range(rng.randrange(50)))
        return rng.randrange(-10 ** 6, 10 ** 6)

    bad = []
    with d.client(timeout_ms=10_000, retries=0) as c:
        for _ in range(3000):
            name = rng.choice(list(fields))
            args: Any = dict(base[name])
            for f in rng.sample(list(fields[name]), min(len(fields[name]), rng.randrange(4))):
                args[f] = value()
            if rng.random() < 0.05:
                args[rng.choice(["x", "Query", "ID", ""])] = value()
            if rng.random() < 0.02:
                args = value()
            context = None
            if name == "file_attention" and rng.random() < 0.5:
                context = {"cwd": "/srv", "project": rng.choice(["/srv/.git", None]),
                           "tail": rng.choice(["gw/nginx.conf", "../x", None, "/abs"]),
                           "tail_is_absolute": rng.choice([True, False]), "stripped_root": None, "path_project": None}
            rep = c.send_frames([wire.encode_request(name, args, new_rid(), context)])
            good = isinstance(rep, dict) and (
                (rep.get("status") == "OK" and isinstance(rep.get("data"), dict) and isinstance(rep.get("request"), dict))
                or (rep.get("status") == "ERROR" and rep["error"]["code"] in H.ERROR_CODES
                    and rep["error"]["code"] != "internal_error" and isinstance(rep["error"]["message"], str)))
            if not good:
                bad.append((name, repr(args)[:200], repr(rep)[:200]))
        assert c.call("ping", {})["status"] == "OK"
    assert not bad, bad[:5]


# =================================================================================== violations
async def test_violation_file_attention_other_repo_path_answers_with_launch_repo_file(fa: FaLab) -> None:
    """Rule: "Absolute paths are reduced to a project-relative tail using the nearest Git boundary";
    scope project "restricts ... to the launch project's ... identity" (interface doc, file_attention).
    Asked about /…/other/src/app.py from a client launched in repo, file_attention answers with the
    sessions that touched repo/src/app.py and wt-feat/src/app.py — a different file in a different
    repository — and leaves out the one session that edited the file asked about."""
    target = str(fa.other / "src" / "app.py")
    wrong = {}
    async with mcp_client(fa.d.data_dir, fa.lab.home, fa.repo) as c:
        for path in (target, "../other/src/app.py"):
            env = await hcall(c, "file_attention", {"path": path, "granularity": "events"})
            if "error" in env:
                continue   # failing closed (another project than the launch project) is acceptable
            touched = [e["event"]["path"] for e in env["data"]["events"]]
            if any(p != target for p in touched):
                wrong[path] = touched
    assert not wrong, f"asked about {target}, got touches of other files: {wrong}"


async def test_violation_http_file_attention_resolves_against_the_server_cwd(fa: FaLab) -> None:
    """Rule: "Relative paths are resolved from that launch directory, including when the client is
    routed through the central MCP server" and scope project "fails closed when neither identity can be
    established". The HTTP front-end (supervisord's mcp-http program) uses its own working directory as
    every client's launch directory: a client whose root is `other` gets the server repository's touches."""
    import mcp.types as T

    port = free_port()
    proc = fa.lab.popen(frontend_cmd(fa.d.data_dir, "--no-spawn", "--http", "--port", str(port)), cwd=str(fa.repo),
                        env=frontend_env(fa.lab.home))
    wait_port("127.0.0.1", port, proc)

    async def roots(*_: Any) -> T.ListRootsResult:
        return T.ListRootsResult(roots=[T.Root(uri=f"file://{fa.other}", name="client")])

    try:
        async with http_client(f"http://127.0.0.1:{port}/mcp", read_http_token(fa.d.data_dir),
                               list_roots_callback=roots) as c:
            r = await c.call_tool("file_attention", {"path": "src/app.py", "granularity": "events"})
    finally:
        kill_pid(proc.pid)
    env = r.structured_content
    if "error" not in env:
        roots_seen = {e["event"]["worktree_root"] for e in env["data"]["events"]}
        assert roots_seen <= {str(fa.other)}, roots_seen


def test_violation_damaged_session_document_pins_coverage_partial() -> None:
    """Rule: get_ingest_status "reports conditions (health, coverage, freshness, readiness) with reason
    codes, per-source progress and backlog"; malformed records are counted (alert
    malformed_records_skipped). After a finished run over the Gemini fixtures (two of five documents
    unreadable), coverage still says backfill_in_progress and freshness ingest_backlog — for as long as
    the ingester runs (it never completes those files), so every history call carries coverage_partial —
    while the source reports 0 malformed records and no alert."""
    with lab_ctx("hcg") as lab:
        d = lab.daemon()
        summary = import_transcripts(lab, d, "gemini-cli", FIXTURES / "gemini")
        assert summary["malformed"] >= 2 and summary["imported"] > 0
        status = ok(call(d, "get_ingest_status", {}))
        coverage = next(c for c in status["conditions"] if c["condition_type"] == "coverage")
        gemini = next(s for s in status["sources"] if s["source"] == "gemini")
        problems = []
        if not (gemini["malformed_records"] >= 1 or any(a["code"] == "malformed_records_skipped"
                                                        for a in status["alerts"])):
            problems.append(f"unreadable documents not reported: malformed_records={gemini['malformed_records']}, "
                            f"alerts={status['alerts']}")
        if coverage["reason"] == "backfill_in_progress":
            problems.append(f"finished run still reported as {coverage}, progress {status['current']['progress']}")
        assert not problems, problems


def test_violation_search_top_n_is_not_a_prefix_of_the_ranking(shared: Shared) -> None:
    """Rule: "Results must be ordered by: relevance score descending, event timestamp descending for ties,
    event ID ascending for remaining ties" and "n_hits is honored exactly". With tied hits at the cut,
    n_hits=3 returns other events than the first three of the n_hits=50 ranking (the cut picks ties by
    creation order, the sort by message id)."""
    d = shared.d
    full = [h["id"] for h in find(shared.d, "zqzebraquagga", n_hits=50)]
    assert len(full) == 14
    for n in (2, 3, 5, 8):
        assert [h["id"] for h in find(d, "zqzebraquagga", n_hits=n)] == full[:n], n


def test_violation_search_ties_not_ordered_by_event_id(shared: Shared) -> None:
    """Rule: ties on score and timestamp are ordered by "Event ID ascending". The ids returned are ordered
    by the hidden message ULID instead, which is not the order of the ids an agent sees."""
    hits = find(shared.d, "zqzebraquagga", n_hits=50)
    assert hits[0]["event"]["timestamp"] == iso_ms(T_TIE + 5000)      # timestamp desc holds
    assert hits[-1]["event"]["timestamp"] == iso_ms(T_TIE - 5000)
    tied = [h["id"] for h in hits[1:-1]]
    assert len({h["score"] for h in hits}) == 1
    assert tied == sorted(tied)


def test_violation_snippet_misses_the_match_when_folding_changes_length(shared: Shared) -> None:
    """Rule: search_sessions "returns snippets (bounded, around the matched terms)". In a 32 KB German
    tool output (ß folds to ss before the match) the snippet is a window of unrelated text: the
    character offsets of the folded text are mapped back by proportion."""
    hits = find(shared.d, "Verbindungsabbruch", event_types=["tool_response"], n_hits=1)
    assert hits and hits[0]["id"].startswith("event:")
    assert "verbindungsabbruch" in hits[0]["snippet"]["text"].lower(), hits[0]["snippet"]


def test_violation_long_cjk_query_blocks_the_daemon() -> None:
    """Rule: nothing a caller sends may hang the daemon (DESIGN: one request loop serves every host).
    One search_sessions with a 4096-character Japanese query over five ~900 KB Japanese tool outputs
    held the daemon for seconds: the snippet step scanned each text once per CJK bigram of the query
    (4095 scans). Its work is now bounded by a count (at most ``snippet.UNITS_MAX`` query units located;
    tests/unit/test_history_views.py::test_snippet_work_is_bounded_by_a_count_not_the_query_length counts
    the scans). Here the whole path through a real daemon, with no wall-clock bound: the query is answered
    with a snippet per hit, and another client that asks while it runs is answered too."""
    import zmq

    with lab_ctx("hcd") as lab:
        d = lab.daemon()
        rng = random.Random(1)
        kanji = [chr(x) for x in range(0x4E00, 0x4E00 + 300)]
        for i in range(5):
            text = "".join(rng.choice(kanji) for _ in range(300_000))
            put(d, [ev(f"cjk-{i}", "tool_response", text, T_AGENT + i, tool_name="Bash")])
        query = "".join(rng.choice(kanji) for _ in range(4096))
        long_q, other = (zmq.Context.instance().socket(zmq.REQ) for _ in range(2))
        try:
            for sock in (long_q, other):
                sock.setsockopt(zmq.LINGER, 0)
                sock.connect(d.endpoint)
            long_q.send(wire.encode_request("search_sessions", {"query": query, "event_types": ["tool_response"],
                                                                "n_hits": 50}, new_rid()))
            other.send(wire.encode_request("ping", {}, new_rid()))  # queued behind the long query, or beside it
            for sock in (long_q, other):
                assert sock.poll(120_000), "the daemon stopped answering"
            rep = wire.decode(long_q.recv(), max_bytes=1 << 30)
            assert wire.decode(other.recv())["status"] == "OK"
        finally:
            long_q.close(linger=0)
            other.close(linger=0)
        hits = ok(rep)["results"]
        assert len(hits) == 5 and all(h["snippet"]["truncated"] for h in hits)
        assert all(0 < len(h["snippet"]["text"]) <= H.SNIPPET_CHARS + 2 for h in hits)


def test_violation_compaction_marker_after_the_final_answer_uncompletes_the_turn(shared: Shared) -> None:
    """Rule: "A terminal event is an event that ends a turn and requires new external input"; "completed:
    true means the turn has a terminal event"; final_response "may be null if the turn is incomplete or
    ended without a final assistant response". A turn [user_input, assistant_response, system
    '[conversation compacted]'] had its final answer, yet it is reported completed=false with
    final_response=null (the Codex fixture's 'Move the CSV loader' session shows the same)."""
    d = shared.d
    turn_id = find(d, "zqcompact question")[0]["open"]["turn_id"]
    turn = open_(d, id=turn_id)
    assert turn["turn"]["completed"] is True, turn["turn"]
    assert turn["summary"]["final_response"] is not None
    assert turn["summary"]["final_response"]["text"] == "zqcompact final answer"


def test_violation_event_traversal_crosses_the_turn_boundary(shared: Shared) -> None:
    """Rule (the interface spec's worked examples of open(event)): the terminal assistant_response of turn
    1 has "next_event_id": null beside a non-null "next_turn_id"; a turn's first event has
    "previous_event_id": null. Here previous/next event ids run across turns (session-linear)."""
    d = shared.d
    hits = {h["snippet"]["text"]: h for h in find(d, "zqboundary", n_hits=10)}
    end_of_turn_1 = open_(d, id=hits["zqboundary answer one"]["id"])
    assert end_of_turn_1["traversal"]["next_turn_id"] is not None
    assert end_of_turn_1["traversal"]["next_event_id"] is None, end_of_turn_1["traversal"]
    start_of_turn_2 = open_(d, id=hits["zqboundary two"]["id"])
    assert start_of_turn_2["traversal"]["previous_event_id"] is None, start_of_turn_2["traversal"]


def test_violation_search_hits_whose_event_text_lacks_every_term(shared: Shared) -> None:
    """Rule: search_sessions "returns snippets (bounded, around the matched terms)" of event hits. The
    ingester tags every imported event with its harness and "project:<dir>", and search_sessions matches
    those tags: searching the project's name returns every user input and answer of its sessions, with
    snippets (and event texts) that do not contain the word."""
    d = shared.d
    # the word is in the project's file paths (tool-call arguments): hits, and only hits that contain it
    hits = find(d, "webshop", n_hits=50, event_types=["user_input", "assistant_response", "reasoning", "tool_call",
                                                      "tool_response", "system"])
    assert hits
    assert not find(d, "webshop", n_hits=50)   # no prompt or answer says it: the harness/project tags do not match
    missing = []
    for h in hits:
        text = open_(d, id=h["id"])["content"]["text"]
        if "webshop" not in unicodedata.normalize("NFKC", text).casefold():
            missing.append(h["snippet"]["text"][:60])
    assert not missing, f"{len(missing)} of {len(hits)} hits do not contain the query: {missing[:4]}"


def test_violation_inspector_cli_cannot_pass_n_hits_limit_or_mutations_only(shared: Shared) -> None:
    """The MCP Inspector CLI (the reference client) converts --tool-arg values by the input schema's
    type; n_hits, list_sessions/file_attention limit and mutations_only are declared as union types
    (["integer","null"], ["boolean","null"]), so it sends them as strings and every such call fails
    invalid_request ("n_hits must be an integer"); open's limit (plain "integer") works."""
    # The cause, checked everywhere: no optional input is declared with a union type.
    from mcpfront.history_tools import INPUT_SCHEMAS

    for tool, schema in INPUT_SCHEMAS.items():
        for name, prop in schema["properties"].items():
            assert isinstance(prop.get("type"), str), (tool, name, prop.get("type"))
    # The Inspector itself needs the npm registry (npx downloads it): only where asked for.
    npx = shutil.which("npx")
    if npx is None or not os.environ.get("CONVMEM_TEST_INSPECTOR"):
        pytest.skip("the Inspector CLI runs only with CONVMEM_TEST_INSPECTOR=1 (and npx)")
    script = Path(sys.executable).with_name("convmem-mcp")
    cmd = [npx, "-y", "@modelcontextprotocol/inspector", "--cli", str(script), "--data-dir", shared.d.data_dir,
           "--no-spawn", "--method", "tools/call", "--tool-name", "search_sessions", "--tool-arg", "query=gateway",
           "--tool-arg", "n_hits=5"]
    proc = shared.lab.popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)
    try:
        out, err = proc.communicate(timeout=90)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        pytest.fail("the inspector did not finish")
    result = json.loads(out.decode())
    env_ = result["structuredContent"]
    assert "error" not in env_, env_["error"]
    assert env_["request"]["n_hits"] == 5


def test_violation_millisecond_window_edges_are_off_by_one(shared: Shared) -> None:
    """Rule: file_attention bounds are "inclusive at start_datetime and exclusive at end_datetime ... at
    most millisecond precision". parse_datetime computes floor(timestamp() * 1000) in floating point, so
    some valid instants parse one millisecond early: the one-millisecond window holding a touch at
    1978-09-11T14:45:58.084Z is refused as end <= start (and list_sessions' edges shift the same way)."""
    rep = call(shared.d, "file_attention", {"path": "/zq/old/file.py", "scope": "all", "granularity": "events",
                                            "start_datetime": iso_ms(T_1978), "end_datetime": iso_ms(T_1978 + 1)})
    assert rep["status"] == "OK", rep
    assert rep["data"]["summary"]["total_touches"] == 1
