"""The transcript parsers (ingest.claude / codex / gemini) and ingest.tooltouch, on the fixture files
in tests/support/fixtures/transcripts (written for these tests in the shape of real transcripts). Pure: no
daemon, no store."""
from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from ingest import claude, codex, gemini
from ingest.events import Event, FileTouch, Malformed, SessionInfo
from ingest.tooltouch import exit_code_in, time_ms, touches
from protocol import history as H
from tests.support import FIXTURES

FIX = FIXTURES / "transcripts"
CLAUDE = FIX / "claude" / "projects" / "-home-dev-webshop"
S1 = "6f1c2d3e-8a4b-4c5d-9e0f-1a2b3c4d5e6f"
S2 = "0b7e4f12-3c5a-4d6e-8f90-a1b2c3d4e5f6"
CODEX = FIX / "codex" / "sessions"
S3 = "0199e2a1-5c7d-7e2f-9a31-4b8c6d0e1f23"
S4 = "0199b0c4-1a2b-7c3d-8e4f-5a6b7c8d9e0f"
CODEX_S3 = CODEX / "2025" / "10" / "14" / f"rollout-2025-10-14T11-00-00-{S3}.jsonl"
CODEX_S4 = CODEX / "2025" / "09" / "20" / f"rollout-2025-09-20T07-00-00-{S4}.jsonl"
GEMINI = FIX / "gemini" / "tmp"
GEMINI_S5 = next(GEMINI.glob("*/chats/session-2025-10-16T14-05-3f2a9c1e.json"))
GEMINI_S6 = GEMINI / "calendar" / "chats" / "session-2025-11-03T09-00-8c7d6e5f.json"
ENC = H.ENCRYPTED_REASONING


# --- reading fixtures the way the service does ---------------------------------------------------

class Read:
    """A JSON Lines file parsed from ``start``: complete lines only (a last line without its newline
    is still being written), undecodable lines and Malformed records counted by offset."""

    def __init__(self, mod, path: Path, start: int = 0, info: SessionInfo | None = None) -> None:
        self.info = info or mod.new_info(str(path))
        self.events: list[Event] = []
        self.malformed: list[int] = []
        self.undecodable: list[int] = []
        data = path.read_bytes()
        pos = start
        while (nl := data.find(b"\n", pos)) >= 0:
            offset, raw, pos = pos, data[pos:nl], nl + 1
            try:
                obj = json.loads(raw)
            except ValueError:
                self.undecodable.append(offset)
                continue
            try:
                self.events.extend(mod.parse_line(obj, self.info, offset))
            except Malformed:
                self.malformed.append(offset)


def read_doc(path: Path) -> tuple[SessionInfo, list[Event]]:
    info = gemini.new_info(str(path))
    return info, gemini.parse_document(json.loads(path.read_text()), info)


def check_sequence(events: list[Event], expected: list[tuple]) -> None:
    """(type, tool_name, text prefix, call_id, is_error, exit_code) for every event, in order."""
    got = [(e.type, e.tool_name, e.text, e.call_id, e.is_error, e.exit_code) for e in events]
    assert len(got) == len(expected), "\n".join(map(repr, got))
    for i, (g, x) in enumerate(zip(got, expected)):
        assert g[:2] == x[:2] and g[3:] == x[3:], (i, g, x)
        assert g[2].startswith(x[2]), (i, g[2], x[2])


def check_keys(events: list[Event]) -> None:
    keys = [(e.session, e.key) for e in events]
    assert len(keys) == len(set(keys)), keys
    assert all(e.key for e in events)
    assert all(0 <= e.ts_ms <= 2**48 - 1 for e in events)


def as_dicts(events: list[Event]) -> list[dict]:
    return [vars(e) for e in events]


# --- Claude Code ---------------------------------------------------------------------------------

CLAUDE_S1 = [
    ("user_input", None, "<command-name>/model</command-name>", None, None, None),
    ("system", None, "<local-command-stdout>Set model to", None, None, None),
    ("user_input", None, "The cart total ignores discounts when quantity > 1.", None, None, None),
    ("reasoning", None, "The user says discounts are dropped", None, None, None),
    ("assistant_response", None, "I'll start by reading the cart module.", None, None, None),
    ("tool_call", "Read", '{"file_path":"/home/dev/webshop/shop/cart.py"}', "toolu_01Read", None, None),
    ("tool_response", "Read", "     1→from decimal import Decimal\n", "toolu_01Read", False, None),
    ("tool_call", "Bash", '{"command":"cd /home/dev/webshop && python -m pytest', "toolu_02Bash", None, None),
    ("tool_response", "Bash", "Exit code 1\n.F.\nFAILED tests/test_cart.py", "toolu_02Bash", True, 1),
    ("reasoning", None, ENC, None, None, None),               # redacted_thinking
    ("reasoning", None, ENC, None, None, None),               # empty thinking with a signature
    ("tool_call", "Edit", '{"file_path":"/home/dev/webshop/shop/cart.py","old_string":', "toolu_03Edit", None, None),
    ("tool_response", "Edit", "The file /home/dev/webshop/shop/cart.py has been updated.", "toolu_03Edit", False, None),
    ("assistant_response", None, "Let me check for other callers", None, None, None),
    ("tool_call", "Grep", '{"pattern":"discount","path":"/home/dev/webshop/shop/"', "toolu_04Grep", None, None),
    ("tool_response", "Grep", "Found 2 files\n/home/dev/webshop/shop/cart.py\n/home/dev/webshop/shop/promo.py",
     "toolu_04Grep", False, None),
    ("tool_call", "Task", '{"description":"Audit promo discounts"', "toolu_05Task", None, None),
    ("tool_response", "Task", "shop/promo.py:14 applies", "toolu_05Task", False, None),
    ("tool_call", "Read", '{"file_path":"/home/dev/webshop/docs/cart-bug.png"}', "toolu_06Read", None, None),
    ("tool_response", "Read", "[image]", "toolu_06Read", False, None),
    ("system", None, "[conversation compacted] trigger: manual, tokens before: 48213", None, None, None),
    ("system", None, "[conversation summary]\nThis session is being continued", None, None, None),
    ("user_input", None, "Great. This is what the cart page showed before the fix; run the whole suite now.\n[image]",
     None, None, None),
    ("tool_call", "Bash", '{"command":"cd /home/dev/webshop && python -m pytest -q"', "toolu_07Bash", None, None),
    ("tool_response", "Bash", "." * 42 + "\n42 passed in 1.20s", "toolu_07Bash", False, None),
    ("tool_call", "Write", '{"file_path":"/home/dev/webshop/CHANGELOG.md"', "toolu_08Write", None, None),
    ("tool_response", "Write", "File created successfully", "toolu_08Write", False, None),
    ("assistant_response", None, "All 42 tests pass.", None, None, None),
    ("user_input", None, "Can you also open a PR?", None, None, None),
    ("system", None, "API Error: 529", None, None, None),
    ("system", None, "[Request interrupted by user]", None, None, None),
]


def test_claude_session_sequence():
    r = Read(claude, CLAUDE / f"{S1}.jsonl")
    assert r.malformed == [] and r.undecodable == []
    check_sequence(r.events, CLAUDE_S1)
    assert all(e.session is None for e in r.events)
    by_type = {e.type: e for e in r.events if e.type == "assistant_response"}
    assert by_type["assistant_response"].model == "claude-sonnet-4-5-20250929"
    # exact texts: the whole tool output, compact JSON arguments
    grep = next(e for e in r.events if e.call_id == "toolu_04Grep" and e.type == "tool_call")
    assert grep.text == '{"pattern":"discount","path":"/home/dev/webshop/shop/","output_mode":"files_with_matches"}'
    bash = next(e for e in r.events if e.call_id == "toolu_02Bash" and e.type == "tool_response")
    assert bash.text.endswith("1 failed, 2 passed in 0.08s")
    assert r.events[0].ts_ms == 1760432401005   # 2025-10-14T09:00:01.005Z


def test_claude_session_info():
    info = Read(claude, CLAUDE / f"{S1}.jsonl").info
    assert (info.session_id, info.harness, info.source) == (S1, "claude-code", "claude")
    assert info.cwd == "/home/dev/webshop" and info.branch == "feature/cart-totals"
    assert info.slug == "quiet-sailing-otter"
    assert info.title == "Fix cart discount totals"
    assert info.summary == "Cart totals ignore discounts for quantity > 1"
    assert info.first_prompt.startswith("The cart total ignores discounts")   # not the /model command
    assert info.model == "claude-sonnet-4-5-20250929"                          # not <synthetic>
    assert info.parent_session_id is None and info.mode is None
    assert info.calls == {}   # every call of the file has its result there: none is still waiting


def test_claude_files_from_tool_calls():
    events = Read(claude, CLAUDE / f"{S1}.jsonl").events
    files = [(e.tool_name, [(f.path, f.op) for f in e.files]) for e in events if e.files]
    assert files == [("Read", [("/home/dev/webshop/shop/cart.py", "read")]),
                     ("Edit", [("/home/dev/webshop/shop/cart.py", "edit")]),
                     ("Read", [("/home/dev/webshop/docs/cart-bug.png", "read")]),
                     ("Write", [("/home/dev/webshop/CHANGELOG.md", "write")])]
    assert all(not e.files for e in events if e.type != "tool_call")


def test_claude_keys_unique_and_stable():
    path = CLAUDE / f"{S1}.jsonl"
    first, second = Read(claude, path), Read(claude, path)
    check_keys(first.events)
    assert as_dicts(first.events) == as_dicts(second.events)
    keys = [e.key for e in first.events]
    assert "9a0b1c2d-0015-4000-8000-000000000015#0" in keys and "9a0b1c2d-0015-4000-8000-000000000015#1" in keys
    assert "9a0b1c2d-0004-4000-8000-000000000004" in keys      # a plain prompt: the uuid itself


def test_claude_subagent_new_layout():
    path = CLAUDE / S1 / "subagents" / "agent-a1b2c3d.jsonl"
    info = claude.new_info(str(path))
    assert (info.session_id, info.source, info.parent_session_id) == \
        (f"{S1}/agent-a1b2c3d", "claude-subagents", S1)
    r = Read(claude, path, info=info)
    check_sequence(r.events, [
        ("user_input", None, "Check shop/promo.py for discount logic", None, None, None),
        ("assistant_response", None, "Searching the promo module.", None, None, None),
        ("tool_call", "Glob", '{"pattern":"shop/**/promo*.py","path":"/home/dev/webshop"}', "toolu_11Glob", None, None),
        ("tool_response", "Glob", "/home/dev/webshop/shop/promo.py", "toolu_11Glob", False, None),
        ("tool_call", "Read", '{"file_path":"/home/dev/webshop/shop/promo.py"', "toolu_12Read", None, None),
        ("tool_response", "Read", "    14→    if qty == 1", "toolu_12Read", False, None),
        ("assistant_response", None, "shop/promo.py:14 applies", None, None, None),
    ])
    assert info.session_id == f"{S1}/agent-a1b2c3d" and info.parent_session_id == S1
    assert info.first_prompt.startswith("Check shop/promo.py") and info.model == "claude-haiku-4-5-20251001"
    assert all(e.session is None for e in r.events)
    check_keys(r.events)


def test_claude_subagent_old_layout():
    path = CLAUDE / "agent-5e6f7a8b.jsonl"
    info = claude.new_info(str(path))
    assert (info.session_id, info.source, info.parent_session_id) == ("agent-5e6f7a8b", "claude-subagents", None)
    r = Read(claude, path, info=info)
    assert info.session_id == f"{S2}/agent-5e6f7a8b" and info.parent_session_id == S2
    check_sequence(r.events, [
        ("user_input", None, "Find where currency amounts are rounded", None, None, None),
        ("tool_call", "Grep", '{"pattern":"quantize|ROUND_"', "toolu_31Grep", None, None),
        ("tool_response", "Grep", "shop/money.py:8:", "toolu_31Grep", False, None),
        ("assistant_response", None, "Rounding happens in shop/money.py", None, None, None),
    ])
    assert all(e.session is None for e in r.events)
    # resuming from a checkpoint in the middle of the file: the same session id from its next line
    second_line = path.read_bytes().index(b"\n") + 1
    resumed = Read(claude, path, start=second_line)
    assert resumed.info.session_id == info.session_id
    assert as_dicts(resumed.events) == as_dicts(r.events[1:])


def test_claude_old_session_with_inline_sidechain():
    r = Read(claude, CLAUDE / f"{S2}.jsonl")
    check_sequence(r.events, [
        ("user_input", None, "Where is the currency rounding done?", None, None, None),
        ("reasoning", None, "A quick search subagent", None, None, None),
        ("tool_call", "Task", '{"description":"Find rounding"', "toolu_21Task", None, None),
        ("user_input", None, "Find where currency amounts are rounded", None, None, None),  # no agentId: stays
        ("tool_response", "Task", "Rounding happens in shop/money.py", "toolu_21Task", False, None),
        ("assistant_response", None, "Currency rounding is in", None, None, None),
    ])
    assert r.info.session_id == S2 and r.info.source == "claude" and r.info.slug is None
    assert r.info.first_prompt == "Where is the currency rounding done?"


def _claude_line(**fields):
    base = {"parentUuid": None, "isSidechain": False, "userType": "external", "cwd": "/w", "sessionId": S1,
            "version": "2.0.31", "gitBranch": "main", "type": "user", "uuid": "u-1",
            "timestamp": "2025-10-14T09:00:00+02:00", "message": {"role": "user", "content": "hi"}}
    base.update(fields)
    return base


def test_claude_sidechain_line_with_agent_id_in_main_file_names_its_session():
    info = claude.new_info(f"/p/{S1}.jsonl")
    events = claude.parse_line(_claude_line(isSidechain=True, agentId="77aa88bb"), info, 0)
    assert [(e.session, e.type, e.ts_ms) for e in events] == [(f"{S1}/agent-77aa88bb", "user_input", 1760425200000)]
    assert info.first_prompt is None and info.session_id == S1


def test_claude_server_tool_blocks_and_string_content():
    info = claude.new_info(f"/p/{S1}.jsonl")
    line = _claude_line(type="assistant", uuid="a-1", message={
        "model": "claude-opus-4-1-20250805", "role": "assistant", "content": [
            {"type": "server_tool_use", "id": "srvtoolu_1", "name": "web_search",
             "input": {"query": "decimal rounding"}},
            {"type": "web_search_tool_result", "tool_use_id": "srvtoolu_1", "content": [
                {"type": "web_search_result", "title": "decimal",
                 "url": "https://docs.python.org/3/library/decimal.html", "encrypted_content": "Eq..."}]},
            {"type": "text", "text": ""}, {"type": "thinking", "thinking": ""}, {"type": "image_future"}]})
    check_sequence(claude.parse_line(line, info, 0), [
        ("tool_call", "web_search", '{"query":"decimal rounding"}', "srvtoolu_1", None, None),
        ("tool_response", "web_search", "decimal https://docs.python.org/3/library/decimal.html", "srvtoolu_1",
         False, None),
    ])
    plain = _claude_line(type="assistant", uuid="a-2", message={"role": "assistant", "content": "Done."})
    assert [(e.key, e.type, e.text) for e in claude.parse_line(plain, info, 0)] == \
        [("a-2", "assistant_response", "Done.")]


@pytest.mark.parametrize("content,etype", [
    ("<bash-input>git status</bash-input>", "user_input"),
    ("<bash-stdout>On branch main</bash-stdout><bash-stderr></bash-stderr>", "system"),
    ("<local-command-stderr>Error: unknown model</local-command-stderr>", "system"),
    ([{"type": "text", "text": "[Request interrupted by user for tool use]"}], "system"),
])
def test_claude_harness_notes_in_user_lines(content, etype):
    info = claude.new_info(f"/p/{S1}.jsonl")
    [event] = claude.parse_line(_claude_line(message={"role": "user", "content": content}), info, 0)
    assert (event.key, event.type) == ("u-1", etype)
    assert info.first_prompt is None


def test_claude_user_line_with_results_and_text():
    info = claude.new_info(f"/p/{S1}.jsonl")
    info.calls.update({"t1": "Bash", "t2": "Read"})
    line = _claude_line(uuid="u-5", message={"role": "user", "content": [
        {"type": "tool_result", "tool_use_id": "t1", "content": "Exit code 2"},
        {"type": "text", "text": "stop, use make instead"},
        {"type": "tool_result", "tool_use_id": "t2", "content": [], "is_error": True}]},
        toolUseResult={"exitCode": 9})                  # two results: the line's toolUseResult names neither
    check_sequence(claude.parse_line(line, info, 0), [
        ("tool_response", "Bash", "Exit code 2", "t1", False, 2),
        ("user_input", None, "stop, use make instead", None, None, None),
        ("tool_response", "Read", "", "t2", True, None),
    ])
    assert [e.key for e in claude.parse_line(line, info, 0)] == ["u-5#0", "u-5", "u-5#2"]


def test_claude_exit_code_from_tool_use_result_object():
    info = claude.new_info(f"/p/{S1}.jsonl")
    line = _claude_line(uuid="u-9", message={"role": "user", "content": [
        {"type": "tool_result", "tool_use_id": "toolu_x", "content": "boom", "is_error": True}]},
        toolUseResult={"stdout": "", "stderr": "boom", "exitCode": 3})
    [event] = claude.parse_line(line, info, 0)
    assert (event.key, event.exit_code, event.is_error, event.tool_name) == ("u-9#0", 3, True, None)


@pytest.mark.parametrize("line", [
    {"type": "progress", "data": {"type": "hook_progress"}, "uuid": "p", "timestamp": "2025-10-14T09:00:00Z"},
    {"type": "file-history-snapshot", "messageId": "m", "snapshot": {}, "isSnapshotUpdate": True},
    {"type": "queue-operation", "operation": "dequeue", "timestamp": "2025-10-14T09:00:00Z"},
    {"type": "attachment", "attachment": {"type": "hook"}},
    {"type": "some-future-record", "whatever": [1, 2]},
    {"type": "user", "isMeta": True, "message": {"role": "user", "content": "<command-message>init</command-message>"}},
    {"type": "system", "subtype": "turn_duration", "durationMs": 10, "uuid": "s", "timestamp": "2025-10-14T09:00:00Z"},
    {"type": "summary", "summary": "A title", "leafUuid": "x"},
])
def test_claude_records_without_events(line):
    assert claude.parse_line(line, claude.new_info(f"/p/{S1}.jsonl"), 0) == []


def test_claude_damaged_file():
    r = Read(claude, FIX / "claude" / "damaged" / "d0d0d0d0-1111-4222-8333-444455556666.jsonl")
    # a user line without a timestamp, a JSON array, an assistant line whose message is a string
    assert len(r.malformed) == 3 and len(r.undecodable) == 1   # and a torn line; the unfinished last waits
    assert [(e.type, e.text) for e in r.events] == [
        ("user_input", "Rename the helper in utils.py"),
        ("assistant_response", "Renamed `fmt` to `format_price` in utils.py.")]


@pytest.mark.parametrize("line", [
    [1, 2], "text", None,
    {"no": "type"},
    {"type": "user", "uuid": "u", "timestamp": "2025-10-14T09:00:00Z"},                        # no message
    {"type": "user", "timestamp": "2025-10-14T09:00:00Z", "message": {"content": "x"}},       # no uuid
    {"type": "assistant", "uuid": "u", "timestamp": "2025-10-14T09:00:00", "message": {"content": "x"}},  # naive
    {"type": "user", "uuid": "u", "timestamp": "2025-10-14T09:00:00Z", "message": {"content": 7}},
    {"type": "system", "subtype": "compact_boundary", "uuid": "s"},                           # no time
])
def test_claude_malformed(line):
    with pytest.raises(Malformed):
        claude.parse_line(line, claude.new_info(f"/p/{S1}.jsonl"), 0)


# --- Codex ---------------------------------------------------------------------------------------

CODEX_S3_SEQ = [
    ("user_input", None, "Add a --dry-run flag to the `inventory import` command, with a test.", None, None, None),
    ("reasoning", None, "**Locating the import command**\n\nI need to find", None, None, None),
    ("tool_call", "shell", '{"command":["bash","-lc","rg -n', "call_Qk1rAq2Bv3", None, None),
    ("tool_response", "shell", "Exit code: 0\nWall time: 0.1 seconds\nOutput:\n41:", "call_Qk1rAq2Bv3", False, 0),
    ("reasoning", None, ENC, None, None, None),
    ("tool_call", "apply_patch", "*** Begin Patch\n*** Update File: inventory/cli.py\n", "call_P4tch0001", None, None),
    ("tool_response", "apply_patch", "Success. Updated the following files:\nA tests/test_dry_run.py\n",
     "call_P4tch0001", False, 0),
    ("tool_call", "shell", '{"command":["bash","-lc","make test"]', "call_M4keT3st", None, None),
    ("tool_response", "shell", "Exit code: 2\nWall time: 3.9 seconds\nOutput:\nF\nFAILED", "call_M4keT3st", True, 2),
    ("tool_call", "view_image", '{"path":"docs/import-flow.png"}', "call_V1ewImg", None, None),
    ("tool_response", "view_image", "attached local image path", "call_V1ewImg", None, None),
    ("tool_call", "web_search_call", '{"type":"search","query":"argparse store_true dry-run flag convention"}',
     None, None, None),
    ("assistant_response", None, "Added `--dry-run` to `inventory import`", None, None, None),
    ("user_input", None, "Go ahead, and keep the README in sync.", None, None, None),
    ("system", None, "[conversation compacted]\nSummary so far: --dry-run added", None, None, None),
    ("assistant_response", None, "Adding the fixture CSV and a README note.", None, None, None),
    ("system", None, "[turn aborted: interrupted]", None, None, None),
]


def test_codex_session_sequence():
    r = Read(codex, CODEX_S3)
    assert r.malformed == [] and r.undecodable == []
    check_sequence(r.events, CODEX_S3_SEQ)
    models = [e.model for e in r.events if e.type == "assistant_response"]
    assert models == ["gpt-5-codex", "gpt-5-codex-high"]          # from the turn_context in force
    patch = next(e for e in r.events if e.tool_name == "apply_patch" and e.type == "tool_call")
    assert [(f.path, f.op) for f in patch.files] == [("inventory/cli.py", "edit"), ("tests/test_dry_run.py", "write")]
    image = next(e for e in r.events if e.tool_name == "view_image" and e.type == "tool_call")
    assert [(f.path, f.op) for f in image.files] == [("docs/import-flow.png", "read")]
    shell = [e for e in r.events if e.tool_name == "shell"]
    assert all(not e.files for e in shell)                         # command text is never parsed
    assert all(e.session is None for e in r.events)


def test_codex_session_info_and_duplicates():
    r = Read(codex, CODEX_S3)
    info = r.info
    assert (info.session_id, info.harness, info.source) == (S3, "codex", "codex")
    assert info.cwd == "/home/dev/inventory" and info.branch == "feat/dry-run"
    assert info.model == "gpt-5-codex-high" and info.mode is None
    assert info.first_prompt == "Add a --dry-run flag to the `inventory import` command, with a test."
    prompts = [e.text for e in r.events if e.type == "user_input"]
    assert prompts.count(info.first_prompt) == 1                    # response_item + event_msg: once
    everything = "\n".join(e.text for e in r.events)
    assert "<environment_context>" not in everything and "AGENTS.md" not in everything
    assert "token_count" not in everything


def test_codex_keys_are_offsets_and_stable():
    first, second = Read(codex, CODEX_S3), Read(codex, CODEX_S3)
    check_keys(first.events)
    assert as_dicts(first.events) == as_dicts(second.events)
    data = CODEX_S3.read_bytes()
    for e in first.events:
        line = data[int(e.key):data.index(b"\n", int(e.key))]
        assert json.loads(line)["type"] in ("response_item", "compacted", "event_msg")
    # a re-read from a checkpoint (fresh info, as after a restart) yields the same keys for those lines
    offset = int(first.events[5].key)
    resumed = Read(codex, CODEX_S3, start=offset)
    assert [e.key for e in resumed.events] == [e.key for e in first.events[5:]]


def test_codex_older_rollout():
    r = Read(codex, CODEX_S4)
    check_sequence(r.events, [
        ("user_input", None, "Move the CSV loader into inventory/loaders/ and delete the legacy loader.\n[image]",
         None, None, None),
        ("reasoning", None, "**Planning the move**\n\nCheck callers of `load` first.", None, None, None),
        ("tool_call", "local_shell", '{"type":"exec","command":["rg","-l","from inventory.loader import"]',
         "call_L0calSh", None, None),
        ("tool_response", "local_shell", "inventory/cli.py\n", "call_L0calSh", False, 0),
        ("tool_call", "apply_patch", '{"input":"*** Begin Patch\\n*** Delete File: legacy/old_loader.py',
         "call_Ap1Patch", None, None),
        ("tool_response", "apply_patch", "Success. Updated the following files:\nD legacy/old_loader.py",
         "call_Ap1Patch", False, 0),
        ("tool_call", "shell", '{"command":["bash","-lc","python -m pytest -q tests/test_loader.py"]', "call_Py7est",
         None, None),
        ("tool_response", "shell", "ImportError: cannot import name 'load'", "call_Py7est", True, 4),
        ("tool_call", "mcp__convmem__file_attention", '{"path":"inventory/loader.py"}', "call_Mcp0001", None, None),
        ("tool_response", "mcp__convmem__file_attention", '{"sessions":[]}', "call_Mcp0001", False, None),
        ("assistant_response", None, "Moved the loader to `inventory/loaders/csv_loader.py` and deleted "
         "`legacy/old_loader.py`; \none import", None, None, None),
        ("system", None, "[conversation compacted]", None, None, None),
    ])
    patch = r.events[4]
    assert [(f.path, f.op) for f in patch.files] == [("legacy/old_loader.py", "delete"),
                                                     ("inventory/loader.py", "edit"),
                                                     ("inventory/loaders/csv_loader.py", "write")]
    assert r.events[8].files == []                                  # an MCP tool with a path argument
    assert r.events[-1].text == "[conversation compacted]"
    info = r.info
    assert (info.session_id, info.cwd, info.branch, info.model) == (S4, "/home/dev/inventory", "main", "gpt-5")
    assert info.first_prompt == "Move the CSV loader into inventory/loaders/ and delete the legacy loader."


def test_codex_session_meta_adopted_when_file_name_has_no_uuid():
    info = codex.new_info("/x/rollout-renamed.jsonl")
    assert info.session_id == "rollout-renamed"
    meta = {"timestamp": "2025-10-14T11:00:00Z", "type": "session_meta",
            "payload": {"id": "abc", "cwd": "/w", "git": {"branch": "dev"}}}
    assert codex.parse_line(meta, info, 0) == []
    assert (info.session_id, info.cwd, info.branch) == ("abc", "/w", "dev")


def test_codex_output_shapes():
    info = codex.new_info(f"/x/rollout-2025-10-14T11-00-00-{S3}.jsonl")
    def out(output):
        info.calls["c1"] = "shell"   # each output answers the call (and takes it out of info.calls)
        line = {"timestamp": 1760439605001, "type": "response_item",
                "payload": {"type": "function_call_output", "call_id": "c1", "output": output}}
        [e] = codex.parse_line(line, info, 77)
        return e.key, e.ts_ms, e.text, e.is_error, e.exit_code, e.tool_name

    exec_output = "Process exited with code 1\nOutput:\nExit code: 0\n"   # the header counts, not the output
    assert out(exec_output) == ("77", 1760439605001, exec_output, True, 1, "shell")
    assert info.calls == {}
    assert out('{"ok":true}')[2:5] == ('{"ok":true}', None, None)
    assert out({"content": "denied", "success": False})[2:5] == ("denied", True, None)
    assert out([{"type": "input_text", "text": "a"}, {"type": "input_image", "image_url": "data:"}])[2] == "a\n[image]"


def test_codex_reasoning_and_messages():
    info = codex.new_info(f"/x/rollout-2025-10-14T11-00-00-{S3}.jsonl")

    def item(payload):
        return codex.parse_line({"timestamp": "2025-10-14T11:00:00Z", "type": "response_item", "payload": payload},
                                info, 5)

    assert [e.text for e in item({"type": "reasoning", "summary": [],
                                  "content": [{"type": "reasoning_text", "text": "raw thoughts"}]})] == ["raw thoughts"]
    assert item({"type": "reasoning", "summary": []}) == []
    assert item({"type": "message", "role": "developer", "content": [{"type": "input_text", "text": "x"}]}) == []
    assert item({"type": "message", "role": "user", "content": [
        {"type": "input_text", "text": "<environment_context>\n<cwd>/w</cwd>\n</environment_context>"}]}) == []
    assert item({"type": "future_item", "x": 1}) == []
    with pytest.raises(Malformed):
        item({"type": "message", "role": "user"})


def test_codex_damaged_file():
    path = FIX / "codex" / "damaged" / "rollout-2025-10-21T10-00-00-0199ffff-0000-7000-8000-00000000dead.jsonl"
    r = Read(codex, path)
    # "42", a response_item without payload, one without a timestamp, a function_call without a name
    assert len(r.malformed) == 4 and len(r.undecodable) == 1        # a torn line; the unfinished last waits
    assert [(e.type, e.text) for e in r.events] == [("user_input", "Bump the version to 1.4.0"),
                                                    ("assistant_response", "Bumped to 1.4.0 in pyproject.toml.")]
    assert r.info.session_id == "0199ffff-0000-7000-8000-00000000dead" and r.info.cwd == "/home/dev/pkg"


# --- Gemini CLI ----------------------------------------------------------------------------------

GEMINI_S5_SEQ = [
    ("user_input", None, "Why does `npm test` fail on the date formatter?", None, None, None),
    ("reasoning", None, "Investigating the failure\nI'll read src/format.ts", None, None, None),
    ("assistant_response", None, "Let me look at the formatter and run its test.", None, None, None),
    ("tool_call", "read_file", '{"absolute_path":"/home/dev/calendar/src/format.ts"}',
     "read_file-1760623514021-6a1f0b2c3d4e5", None, None),
    ("tool_response", "read_file", "export function formatDay(", "read_file-1760623514021-6a1f0b2c3d4e5", False, None),
    ("tool_call", "run_shell_command", '{"command":"npm test -- format","description":"Run the formatter tests."}',
     "run_shell_command-1760623518870-0f9e8d7c6b5a4", None, None),
    ("tool_response", "run_shell_command", "Command: npm test -- format\nDirectory: (root)\nOutput:",
     "run_shell_command-1760623518870-0f9e8d7c6b5a4", False, 1),
    ("reasoning", None, "Fixing the time zone", None, None, None),
    ("tool_call", "replace", '{"file_path":"/home/dev/calendar/src/format.ts","old_string":"{ timeZone: \'UTC\' }"',
     "replace-1760623560102-1a2b3c4d5e6f7", None, None),
    ("tool_response", "replace", "Failed to edit, 0 occurrences found", "replace-1760623560102-1a2b3c4d5e6f7",
     True, None),
    ("tool_call", "replace", '{"file_path":"/home/dev/calendar/src/format.ts"', "replace-1760623571440-7f6e5d4c3b2a1",
     None, None),
    ("tool_response", "replace", "Successfully modified file", "replace-1760623571440-7f6e5d4c3b2a1", False, None),
    ("tool_call", "read_many_files", '{"paths":["src/format.test.ts","src/**/*.spec.ts"]}',
     "read_many_files-1760623580001-abcdef0123456", None, None),
    ("tool_response", "read_many_files", "--- src/format.test.ts ---", "read_many_files-1760623580001-abcdef0123456",
     False, None),
    ("tool_call", "write_file", '{"file_path":"/home/dev/calendar/NOTES.md"', "write_file-1760623590000-0a1b2c3d4e5f6",
     None, None),
    ("tool_response", "write_file", "[cancelled]", "write_file-1760623590000-0a1b2c3d4e5f6", False, None),
    ("system", None, "Request cancelled.", None, None, None),
    ("user_input", None, "Skip the notes file. Does the test pass now?", None, None, None),
    ("assistant_response", None, "Yes: `formatDay` now formats", None, None, None),
    ("system", None, "Chat history compressed from 48210 to 6120 tokens.", None, None, None),
    ("system", None, "[error] [API Error: You exceeded your current quota.", None, None, None),
]


def test_gemini_session_sequence():
    info, events = read_doc(GEMINI_S5)
    check_sequence(events, GEMINI_S5_SEQ)
    files = [(e.tool_name, [(f.path, f.op) for f in e.files]) for e in events if e.files]
    assert files == [("read_file", [("/home/dev/calendar/src/format.ts", "read")]),
                     ("replace", [("/home/dev/calendar/src/format.ts", "edit")]),
                     ("replace", [("/home/dev/calendar/src/format.ts", "edit")]),
                     ("read_many_files", [("src/format.test.ts", "read")]),    # the glob entry is not a file
                     ("write_file", [("/home/dev/calendar/NOTES.md", "write")])]
    assert [e.model for e in events if e.type == "assistant_response"] == ["gemini-2.5-pro", "gemini-2.5-flash"]
    thought = events[1]
    assert thought.ts_ms == time_ms("2025-10-16T14:05:14.000Z") and thought.key.endswith("#thought0")
    assert events[3].ts_ms == time_ms("2025-10-16T14:05:21.000Z")             # a call's own time
    assert (info.session_id, info.harness, info.source, info.cwd) == \
        ("3f2a9c1e-7b6d-4e5f-8a9b-0c1d2e3f4a5b", "gemini-cli", "gemini", None)
    assert info.first_prompt == "Why does `npm test` fail on the date formatter?"
    assert info.model == "gemini-2.5-flash"
    assert info.calls == {}   # each call's result is in its own record: nothing waits for a later one


def test_gemini_keys_unique_stable_and_growing_document():
    doc = json.loads(GEMINI_S5.read_text())
    _, events = read_doc(GEMINI_S5)
    check_keys(events)
    assert events[3].key == "a8f2c0de-0002-4b1e-9c3a-000000000002#call0"
    assert events[4].key == "a8f2c0de-0002-4b1e-9c3a-000000000002#result0"
    assert events[0].key == "a8f2c0de-0001-4b1e-9c3a-000000000001"
    # the file is rewritten with one more message: every earlier event comes back identical
    doc["messages"].append({"id": "a8f2c0de-0009-4b1e-9c3a-000000000009", "timestamp": "2025-10-16T14:10:00.000Z",
                            "type": "user", "content": "one more"})
    grown = gemini.parse_document(doc, gemini.new_info(str(GEMINI_S5)))
    assert as_dicts(grown[:-1]) == as_dicts(events)
    assert (grown[-1].key, grown[-1].text) == ("a8f2c0de-0009-4b1e-9c3a-000000000009", "one more")


def test_gemini_newer_document():
    info, events = read_doc(GEMINI_S6)
    check_sequence(events, [
        ("user_input", None, "What time zone does Intl.DateTimeFormat use by default?", None, None, None),
        ("reasoning", None, "Checking the spec\nA quick search confirms the default.", None, None, None),
        ("assistant_response", None, "It uses the runtime's default time zone unless `timeZone` is given.",
         None, None, None),
        ("tool_call", "google_web_search", '{"query":"Intl.DateTimeFormat default timeZone"}',
         "google_web_search-1762160408000-aa11bb22cc33d", None, None),
        ("tool_response", "google_web_search", "Web search results for",
         "google_web_search-1762160408000-aa11bb22cc33d", False, None),
        ("system", None, "[warning] Loop detected, stopping execution.", None, None, None),
        ("user_input", None, "thanks", None, None, None),
    ])
    assert events[5].key == "@2"                                        # no id: the message index
    assert info.summary == "Look up the Intl.DateTimeFormat time zone default"
    assert info.session_id == "8c7d6e5f-4a3b-4c2d-9e1f-0a9b8c7d6e5f"


def test_gemini_damaged_documents():
    damaged = FIX / "gemini" / "damaged"
    with pytest.raises(ValueError):                                     # torn rewrite: not JSON at all
        json.loads((damaged / "session-truncated.json").read_text())
    with pytest.raises(Malformed):
        read_doc(damaged / "session-not-a-session.json")
    for bad in ([], "x", {"sessionId": "s"}, {"messages": None}):
        with pytest.raises(Malformed):
            gemini.parse_document(bad, gemini.new_info("/x/session-1.json"))
    info, events = read_doc(damaged / "session-bad-entries.json")
    start = time_ms("2025-10-22T10:00:00.000Z")
    assert [(e.key, e.ts_ms, e.type, e.text) for e in events] == [
        ("m1", start, "user_input", "no timestamp here: inherits startTime"),
        ("m2", start, "assistant_response", "bad timestamp: inherits m1's time"),
        ("m2@4", start + 10_000, "assistant_response", "a duplicate id"),
    ]


# --- tooltouch -----------------------------------------------------------------------------------

PATCH = ("*** Begin Patch\n*** Add File: docs/new.md\n+hello\n*** Update File: src/app.py\n*** Move to: src/main.py\n"
         "@@\n-a\n+b\n*** Delete File: old/legacy.py\n*** End Patch\n")


@pytest.mark.parametrize("tool,args,expected", [
    ("Read", {"file_path": "/w/a.py", "offset": 10}, [("/w/a.py", "read")]),
    ("Write", {"file_path": "/w/b.py", "content": "x"}, [("/w/b.py", "write")]),
    ("Edit", {"file_path": "/w/c.py", "old_string": "a", "new_string": "b"}, [("/w/c.py", "edit")]),
    ("MultiEdit", {"file_path": "/w/d.py", "edits": []}, [("/w/d.py", "edit")]),
    ("NotebookEdit", {"notebook_path": "/w/n.ipynb", "new_source": "x"}, [("/w/n.ipynb", "edit")]),
    ("Read", {"file_path": "app/[id]/page.tsx"}, [("app/[id]/page.tsx", "read")]),   # brackets are a real name
    ("apply_patch", PATCH, [("docs/new.md", "write"), ("src/app.py", "edit"), ("src/main.py", "write"),
                            ("old/legacy.py", "delete")]),
    ("apply_patch", {"input": PATCH}, [("docs/new.md", "write"), ("src/app.py", "edit"), ("src/main.py", "write"),
                                       ("old/legacy.py", "delete")]),
    ("apply_patch", "*** Begin Patch\n*** Update File: a.py\n*** Update File: a.py\n*** End Patch",
     [("a.py", "edit")]),                                                               # duplicates once
    ("view_image", {"path": "shots/s.png"}, [("shots/s.png", "read")]),
    ("read_file", {"absolute_path": "/w/x.ts", "offset": 1}, [("/w/x.ts", "read")]),
    ("read_file", {"file_path": "/w/y.ts"}, [("/w/y.ts", "read")]),
    ("read_many_files", {"paths": ["a.ts", "src/**/*.ts", "b?.ts", "c.{ts,js}", "docs/", "d.ts"]},
     [("a.ts", "read"), ("d.ts", "read")]),
    ("write_file", {"file_path": "/w/z.md", "content": ""}, [("/w/z.md", "write")]),
    ("replace", {"file_path": "/w/r.ts", "old_string": "a", "new_string": "b"}, [("/w/r.ts", "edit")]),
    ("edit", {"file_path": "/w/e.ts"}, [("/w/e.ts", "edit")]),
])
def test_tooltouch_rules(tool, args, expected):
    assert [(f.path, f.op) for f in touches(tool, args)] == expected
    assert all(isinstance(f, FileTouch) and f.op in H.FILE_OPS for f in touches(tool, args))


@pytest.mark.parametrize("tool,args", [
    ("Bash", {"command": "cat /w/a.py && sed -i s/a/b/ /w/b.py"}),
    ("shell", {"command": ["bash", "-lc", "echo x > /w/out.txt"]}),
    ("shell", {"command": ["apply_patch", PATCH]}),                     # another tool's name
    ("run_shell_command", {"command": "rm /w/a.py"}),
    ("local_shell", {"type": "exec", "command": ["touch", "/w/a"]}),
    ("Glob", {"pattern": "**/*.py", "path": "/w"}),
    ("Grep", {"pattern": "x", "path": "/w/a.py"}),
    ("glob", {"pattern": "*.ts"}),
    ("search_file_content", {"pattern": "x", "path": "/w/a.ts"}),
    ("list_directory", {"path": "/w/src"}),
    ("mcp__convmem__file_attention", {"path": "/w/a.py"}),
    ("mcp__filesystem__read_file", {"path": "/w/a.py"}),
    ("read", {"file_path": "/w/a.py"}),                                 # names match exactly
    ("WebFetch", {"url": "https://example.com/a.py"}),
    ("Read", {"file_path": "https://example.com/a.py"}),
    ("Read", {"file_path": "file:///w/a.py"}),
    ("Read", {"file_path": "/w/src/"}),
    ("Read", {"file_path": "."}),
    ("Read", {"file_path": ""}),
    ("Read", {"file_path": "/w/a.py\n/w/b.py"}),
    ("Read", {"path": "/w/a.py"}),                                      # not Read's argument
    ("Read", "/w/a.py"),
    ("Write", None),
    ("apply_patch", {"patch": PATCH}),
    ("apply_patch", "just text, no patch headers"),
    ("read_many_files", {"paths": "a.ts"}),
    ("UnknownTool", {"file_path": "/w/a.py"}),
])
def test_tooltouch_negatives(tool, args):
    assert touches(tool, args) == []


def test_tooltouch_caps_files_per_call():
    patch = "".join(f"*** Add File: f{i}.txt\n+x\n" for i in range(100))
    assert len(touches("apply_patch", patch)) == H.FILES_PER_EVENT_MAX


# --- shared helpers ------------------------------------------------------------------------------

@pytest.mark.parametrize("value,expected", [
    ("2025-10-14T09:00:00Z", 1760432400000),
    ("2025-10-14T11:00:00.123+02:00", 1760432400123),
    (1760432400123, 1760432400123),
    (1760432400123.9, 1760432400123),
    ("2025-10-14T09:00:00", None), ("yesterday", None), (True, None), (None, None), (-1, None), (2**48, None),
    (float("nan"), None), ("", None),
])
def test_time_ms(value, expected):
    assert time_ms(value) == expected


@pytest.mark.parametrize("text,expected", [
    ("Exit code: 3\nWall time: 1s\nOutput:\n", 3), ("Exit code 1\nboom", 1), ("Error: Exit code 127\n", 127),
    ("Process exited with code 0\n", 0), ("Output:\nExit code: 5\n", None), ("all good", None), ("", None),
])
def test_exit_code_in(text, expected):
    assert exit_code_in(text) == expected


# --- discovery -----------------------------------------------------------------------------------

def _touch(path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("{}\n")
    return path


def _oddities(folder: Path, prefix: str, suffix: str) -> None:
    """A FIFO, a directory, a dangling symlink and a symlink to a directory, all named like transcripts."""
    folder.mkdir(parents=True, exist_ok=True)
    os.mkfifo(folder / f"{prefix}fifo{suffix}")
    (folder / f"{prefix}dir{suffix}").mkdir()
    os.symlink(folder / "missing", folder / f"{prefix}dangling{suffix}")
    os.symlink(folder / f"{prefix}dir{suffix}", folder / f"{prefix}dirlink{suffix}")


def test_discover_claude(tmp_path):
    home = tmp_path / "home"
    proj = home / ".claude" / "projects" / "-w-app"
    main = _touch(proj / "s1.jsonl")
    old_agent = _touch(proj / "agent-1234abcd.jsonl")
    new_agent = _touch(proj / "s1" / "subagents" / "agent-a1.jsonl")
    _touch(proj / "s1" / "tool-results" / "x.jsonl")                  # not a transcript folder
    _touch(proj / "notes.txt")
    xdg = _touch(home / ".config" / "claude" / "projects" / "-w-b" / "s2.jsonl")
    custom = _touch(tmp_path / "cfg" / "projects" / "-w-c" / "s3.jsonl")
    elsewhere = _touch(tmp_path / "outside" / "real.jsonl")
    os.symlink(elsewhere, proj / "linked.jsonl")
    _oddities(proj, "", ".jsonl")
    env = {"CLAUDE_CONFIG_DIR": str(tmp_path / "cfg")}
    found = claude.discover(env, str(home))
    assert found == sorted(map(str, [main, old_agent, new_agent, xdg, custom, proj / "linked.jsonl"]))
    assert claude.discover({}, str(tmp_path / "nobody")) == []
    # the same directory reached twice is listed once
    assert claude.discover({"CLAUDE_CONFIG_DIR": str(home / ".claude")}, str(home)) == \
        sorted(map(str, [main, old_agent, new_agent, xdg, proj / "linked.jsonl"]))


def test_discover_codex(tmp_path):
    home = tmp_path / "home"
    day = home / ".codex" / "sessions" / "2025" / "10" / "14"
    a = _touch(day / f"rollout-2025-10-14T11-00-00-{S3}.jsonl")
    archived = _touch(home / ".codex" / "archived_sessions" / f"rollout-2025-09-20T07-00-00-{S4}.jsonl")
    _touch(day / "notes.jsonl")
    _touch(home / ".codex" / "sessions" / "rollout-too-shallow.jsonl")
    target = _touch(tmp_path / "real.jsonl")
    os.symlink(target, day / "rollout-linked.jsonl")
    _oddities(day, "rollout-", ".jsonl")
    assert codex.discover({}, str(home)) == sorted(map(str, [a, archived, day / "rollout-linked.jsonl"]))
    custom = tmp_path / "codexhome"
    b = _touch(custom / "sessions" / "2025" / "11" / "01" / "rollout-b.jsonl")
    assert codex.discover({"CODEX_HOME": str(custom)}, str(home)) == [str(b)]


def test_discover_gemini(tmp_path):
    home = tmp_path / "home"
    chats = home / ".gemini" / "tmp" / ("ab" * 32) / "chats"
    a = _touch(chats / "session-2025-10-16T14-05-3f2a9c1e.json")
    b = _touch(home / ".gemini" / "tmp" / "calendar" / "chats" / "session-2025-11-03T09-00-8c7d6e5f.json")
    _touch(chats / "checkpoint-x.json")
    _touch(home / ".gemini" / "tmp" / ("ab" * 32) / "logs.json")
    _oddities(chats, "session-", ".json")
    assert gemini.discover({}, str(home)) == sorted(map(str, [a, b]))
    other = _touch(tmp_path / "gh" / ".gemini" / "tmp" / "p" / "chats" / "session-z.json")
    assert gemini.discover({"GEMINI_CLI_HOME": str(tmp_path / "gh")}, str(home)) == sorted(map(str, [a, b, other]))


# --- module surface ------------------------------------------------------------------------------

def test_module_constants():
    assert (claude.HARNESS, claude.SOURCES) == ("claude-code", ("claude", "claude-subagents"))
    assert (codex.HARNESS, codex.SOURCES) == ("codex", ("codex",))
    assert (gemini.HARNESS, gemini.SOURCES) == ("gemini-cli", ("gemini",))
    for mod in (claude, codex, gemini):
        assert mod.HARNESS in H.HARNESSES and set(mod.SOURCES) <= set(H.SOURCES)
