"""Agent history at scale: ingest throughput, search_sessions / open latency, start-up, RSS and the bytes
an agent receives, each beside SQLite (WAL, synchronous=FULL, FTS5 porter unicode61) in the same run.

    python -m bench.history_bench                          # 100k events (~4 minutes on 2 cores)
    python -m bench.history_bench --sizes 100000,1000000   # and 1M (~680 MB of transcripts, ~30 minutes more)
    python -m bench.history_bench --quick                  # 2k events: a smoke run, not a measurement
    python -m bench.history_bench --json out.json [--keep] [--profile DIR]

Corpus: a seeded generator writes real Codex rollout files (``$CODEX_HOME/sessions/YYYY/MM/DD/
rollout-<time>-<uuid>.jsonl``; session_meta, turn_context, response_item message / function_call /
custom_tool_call (apply_patch) / function_call_output / reasoning, event_msg user_message /
agent_message / token_count noise) in a temp directory, deleted afterwards. Sessions have 40-60
events in turns of a user prompt, reasoning, 0-6 tool calls with their outputs and an answer; prompts
and answers use LoCoMo dialogue text (``../shared/data/locomo-dev.json``, else a word generator)
with coding templates (file paths, functions, flags); ~6% of sessions are in Japanese; tool outputs
(pytest, rustc, tsc, go, gcc, logs, rg, git diff) are log-normal in size with a tail to 64 KB.

Ingest: ``convmem-ingest --once --no-spawn --harness codex`` (HOME and CODEX_HOME pointing at the
corpus) into a fresh daemon, wall time from process start to exit -> events/s and MB/s of transcript.
SQLite: the same files read by the same reader and parsed by the same parser (``ingest.reader``,
``ingest.codex``), the same derived message ids, inserted into an events table plus an external-content
FTS5 index (content, event type, session), 1000 events per transaction (WAL, synchronous=FULL). So the
SQLite figure leaves out what the daemon, IPC, redaction and path resolution cost, nothing else.

Search: a few hundred queries taken from the corpus while it is generated — words of user prompts
(default event types user_input + assistant_response), error lines of tool outputs (event_types
['tool_response']), some Japanese keywords — sent as ``search_sessions`` (n_hits 10) over a REQ socket
(msgpack, what the front-ends do), interleaved query by query with FTS5 doing the same search in
process: the query's words (our stop words dropped) OR-ed, ``etype IN (...)`` filtered, top n by bm25,
with ``snippet()``. ``open`` latency: event (whole content), turn id-only, turn limit 20, session
id-only, beside the equivalent SQLite queries (in process). Daemon IPC floor: ``ping`` round trip.

Start-up: clean stop (writes the snapshot), start again, time until it answers ping as loaded; RSS
after ingest and after that start. Agent bytes (smallest size of the run, a sample of questions): a
real stdio MCP front-end (``python -m mcpfront``) driven by the SDK client; per question, the bytes of
the tool results (structuredContent JSON and text content, UTF-8) of (a) search_sessions (n_hits 10)
+ one open of the top event versus (b) search_messages (limit 10, whole messages). Medians and ratio.

The machine is shared and noisy: every figure is a median / p95, every ratio compares figures
taken in the same run.
"""
from __future__ import annotations

import argparse
import asyncio
import gc
import json
import math
import os
import random
import re
import shutil
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import zmq
from ulid import ULID

from bench import common
from bench.common import (REPO, pct, print_table, rss_bytes, stop, turns as locomo_turns,
                          write_json)
from protocol.config import default_endpoint
from protocol.wire import decode, encode_request

T0_MS = 1_735_689_600_000  # 2025-01-01T00:00:00Z
_BIN = Path(sys.executable).parent
INGEST_CMD = [str(_BIN / "convmem-ingest")] if (_BIN / "convmem-ingest").exists() else [sys.executable, "-m", "ingest"]

# ================================================================================ the corpus

_PROJECTS = [
    ("inventory", "python"), ("ledger-api", "rust"), ("webshop", "typescript"), ("kvstore", "go"),
    ("imgproc", "c"), ("billing", "python"), ("scheduler", "go"), ("dashboard", "typescript"),
    ("parser-kit", "rust"), ("mlpipe", "python"), ("authsvc", "go"), ("docs-site", "typescript"),
]
_HOMES = ["/home/dev", "/Users/alex/src", "/home/mei/work", "/srv/build"]
_WORDS = ("item order invoice cache loader parser config token session user account payment report "
          "schedule queue worker retry index snapshot metric event stream buffer client server router "
          "handler request response record batch export import migrate schema table column filter "
          "sort page cursor limit offset timeout deadline lock mutex channel signal logger trace span "
          "auth role policy grant secret key hash digest chunk frame codec image pixel kernel tensor "
          "model feature label split train eval score rank query match term posting shard replica").split()
_VERBS = "load parse save fetch build render validate normalize encode decode flush merge resolve".split()
_FLAGS = "dry-run verbose force json limit since until no-cache strict quiet watch all".split()
_EXT = {"python": ".py", "rust": ".rs", "typescript": ".ts", "go": ".go", "c": ".c"}
_STOP = frozenset("the a an and or of to in on for with is are was were be been this that it its at by from as "
                  "i you he she we they me my your our their his her what when where why how which who "
                  "do does did not no can could would should will just so but if then than there here".split())

_JA = [  # (sentence, a keyword of it to search for)
    ("本番データベースの移行手順を確認してください。", "データベースの移行"),
    ("テストが失敗する原因を調べてほしい。", "テストが失敗"),
    ("設定ファイルの読み込み処理をリファクタリングしたい。", "設定ファイル"),
    ("ログの出力形式をJSONに変更してください。", "ログの出力形式"),
    ("型エラーを修正して、CIを通してください。", "型エラー"),
    ("この関数のパフォーマンスを改善できますか？", "パフォーマンス"),
    ("キャッシュの有効期限が切れたときの挙動がおかしい。", "キャッシュの有効期限"),
    ("認証トークンの更新処理にバグがあるようです。", "認証トークン"),
    ("依存関係のバージョンを上げたらビルドが壊れました。", "依存関係のバージョン"),
    ("エラーメッセージをもっと分かりやすくしてください。", "エラーメッセージ"),
    ("ドキュメントに使い方の例を追加してください。", "使い方の例"),
    ("並行処理でデッドロックが発生しているかもしれない。", "デッドロック"),
    ("メモリ使用量が増え続けている原因を特定したい。", "メモリ使用量"),
    ("検索結果の並び順が期待と違います。", "検索結果の並び順"),
    ("日付のタイムゾーン変換が間違っています。", "タイムゾーン変換"),
    ("バックアップからの復元手順を書いてください。", "復元手順"),
    ("APIのレスポンスが遅いので調査してください。", "レスポンスが遅い"),
    ("ユニットテストを追加してカバレッジを上げたい。", "カバレッジ"),
    ("マイグレーションスクリプトを作成してください。", "マイグレーション"),
    ("例外処理を見直して、リトライを入れてください。", "例外処理"),
]
_JA_ANSWERS = ["修正しました。{file} の {func} でNoneチェックが抜けていました。",
               "原因は設定ファイルのパスが相対パスになっていたことです。", "テストはすべて通りました。",
               "ビルドエラーを修正し、依存関係を更新しました。", "ログの出力形式を変更し、ドキュメントも更新しました。",
               "{func} に単体テストを三件追加しました。", "タイムアウトを30秒に延ばし、リトライを入れました。"]

_PY_ERR = [("AssertionError", "assert {a} == {b}"), ("KeyError", "'{w}_{w2}'"),
           ("TypeError", "{f}() missing 1 required positional argument: '{w}'"),
           ("AttributeError", "'NoneType' object has no attribute '{f}'"),
           ("ModuleNotFoundError", "No module named '{w}_{w2}'"),
           ("ValueError", "invalid literal for int() with base 10: '{w}'")]
_RS_ERR = [("E0308", "mismatched types"), ("E0382", "borrow of moved value: `{w}`"),
           ("E0425", "cannot find value `{f}` in this scope"), ("E0599", "no method named `{f}` found for struct `{W}`")]
_TS_ERR = [("TS2339", "Property '{f}' does not exist on type '{W}'."),
           ("TS2345", "Argument of type 'string' is not assignable to parameter of type 'number'."),
           ("TS2304", "Cannot find name '{f}'.")]
_GO_ERR = [("undefined", "{f}"), ("cannot use", "{w} (variable of type string) as int value in argument to {f}")]
_C_ERR = [("implicit declaration of function", "'{f}' [-Wimplicit-function-declaration]"),
          ("use of undeclared identifier", "'{w}'")]


def _ts(ms: int) -> str:
    t = time.gmtime(ms // 1000)
    return time.strftime("%Y-%m-%dT%H:%M:%S", t) + f".{ms % 1000:03d}Z"


def _uuid(rng: random.Random, ms: int) -> str:
    h = f"{ms:012x}"[-12:] + f"{rng.getrandbits(80):020x}"
    return f"{h[:8]}-{h[8:12]}-7{h[13:16]}-{'89ab'[rng.randrange(4)]}{h[17:20]}-{h[20:32]}"


class Corpus:
    """Writes N events' worth of Codex rollouts under ``root/sessions`` and keeps query candidates.

    ``JA_SHARE`` (sessions in Japanese) and ``OUTPUT_MEDIAN`` (bytes, of the log-normal tool outputs)
    are class attributes so that a larger, heavier mix (``bench/scale_corpus.py``) is a subclass."""

    JA_SHARE = 0.06
    OUTPUT_MEDIAN = 350

    def __init__(self, root: str, n_events: int, seed: int = 42) -> None:
        self.root = root
        self.n_target = n_events
        self.rng = random.Random(seed)
        base = locomo_turns()
        self.lines = [t.split(": ", 1)[-1] for t in base]
        self.events = 0
        self.sessions = 0
        self.files = 0
        self.bytes = 0
        self.types: dict[str, int] = {}
        self.max_output = 0
        self.q_prompt: list[str] = []
        self.q_error: list[str] = []
        self.q_ja: list[str] = []

    # ---------------------------------------------------------------- small texts
    def w(self) -> str:
        return self.rng.choice(_WORDS)

    def func(self) -> str:
        return f"{self.rng.choice(_VERBS)}_{self.w()}" + (f"_{self.w()}" if self.rng.random() < 0.3 else "")

    def camel(self) -> str:
        return self.w().capitalize() + self.w().capitalize()

    def file(self, proj: tuple[str, str]) -> str:
        name, lang = proj
        rng = self.rng
        d = rng.choice(["src", "src/" + name.replace("-", "_"), "lib", "internal/" + self.w(), "tests", "pkg/" + self.w()])
        f = self.w() + ("_" + self.w() if rng.random() < 0.4 else "")
        if d == "tests":
            f = "test_" + f
        return f"{d}/{f}{_EXT[lang]}"

    def sentence(self) -> str:
        return self.rng.choice(self.lines)

    def _fill(self, s: str, proj: tuple[str, str]) -> str:
        return s.format(a=self.rng.randrange(100), b=self.rng.randrange(100), w=self.w(), w2=self.w(),
                        f=self.func(), func=self.func(), W=self.camel(), file=self.file(proj))

    def error_line(self, lang: str, proj: tuple[str, str]) -> tuple[str, str]:
        """(error text as the tool prints it, a query that should find it)."""
        rng = self.rng
        if lang == "python":
            name, msg = rng.choice(_PY_ERR)
            msg = self._fill(msg, proj)
            return f"E       {name}: {msg}", f"{name} {msg}"
        if lang == "rust":
            code, msg = rng.choice(_RS_ERR)
            msg = self._fill(msg, proj)
            return (f"error[{code}]: {msg}\n --> {self.file(proj)}:{rng.randrange(1, 900)}:{rng.randrange(1, 80)}",
                    f"{code} {msg}")
        if lang == "typescript":
            code, msg = rng.choice(_TS_ERR)
            msg = self._fill(msg, proj)
            return f"{self.file(proj)}({rng.randrange(1, 900)},{rng.randrange(1, 80)}): error {code}: {msg}", \
                f"{code} {msg}"
        if lang == "go":
            what, msg = rng.choice(_GO_ERR)
            msg = self._fill(msg, proj)
            return f"./{self.file(proj)}:{rng.randrange(1, 900)}:{rng.randrange(1, 80)}: {what}: {msg}", f"{what} {msg}"
        what, msg = rng.choice(_C_ERR)
        msg = self._fill(msg, proj)
        return f"{self.file(proj)}:{rng.randrange(1, 900)}:{rng.randrange(1, 80)}: error: {what} {msg}", f"{what} {msg}"

    def filler_line(self, proj: tuple[str, str], ms: int) -> str:
        rng = self.rng
        k = rng.randrange(6)
        if k == 0:
            return (f"{_ts(ms + rng.randrange(100000))} {rng.choice(['INFO ', 'DEBUG', 'WARN '])} {self.w()}: "
                    f"{rng.choice(_VERBS)} {self.w()} id={rng.randrange(10**6)} duration_ms={rng.randrange(1, 900)}")
        if k == 1:
            return f"{self.file(proj)}:{rng.randrange(1, 900)}:    {self.func()}({self.w()}, {self.w()}_{self.w()})"
        if k == 2:
            return f"{self.file(proj)}::test_{self.func()} PASSED" + " " * rng.randrange(1, 20) + f"[{rng.randrange(100):3d}%]"
        if k == 3:
            return f"{rng.choice('+- ')}    {self.w()} = {self.func()}({self.w()}.{self.w()})"
        if k == 4:
            return f"   Compiling {self.w()}-{self.w()} v0.{rng.randrange(20)}.{rng.randrange(10)}"
        return f"commit {rng.getrandbits(160):040x} {self.sentence()[:60]}"

    def output(self, proj: tuple[str, str], ms: int, fail: bool) -> tuple[str, str | None]:
        """(a tool's output text, a query for its error line if it failed)."""
        rng = self.rng
        if rng.random() < 0.001:
            size = rng.randrange(56 * 1024, 64 * 1024)
        else:
            size = int(min(64 * 1024, max(20, rng.lognormvariate(math.log(self.OUTPUT_MEDIAN), 1.4))))
        parts: list[str] = []
        query = None
        if fail:
            err, query = self.error_line(proj[1], proj)
            parts.append(err)
        n = sum(len(p) + 1 for p in parts)
        while n < size:
            line = self.filler_line(proj, ms)
            parts.append(line)
            n += len(line) + 1
        if fail and len(parts) > 2:  # the error usually sits in the middle or at the end
            j = rng.randrange(len(parts))
            parts[0], parts[j] = parts[j], parts[0]
        text = "\n".join(parts)
        if len(text) > 64 * 1024:
            text = text[:64 * 1024]
        return text, query

    # ---------------------------------------------------------------- one session
    def session(self, ordinal: int) -> None:
        rng = self.rng
        proj = rng.choice(_PROJECTS)
        cwd = f"{rng.choice(_HOMES)}/{proj[0]}"
        start = T0_MS + ordinal * 600_000 + rng.randrange(300_000)   # ~10 min apart, spread over time
        sid = _uuid(rng, start)
        ja = rng.random() < self.JA_SHARE
        target = rng.randint(40, 60)
        model = rng.choice(["gpt-5-codex", "gpt-5", "gpt-5-codex-high"])
        t = time.gmtime(start // 1000)
        day = os.path.join(self.root, "sessions", f"{t.tm_year:04d}", f"{t.tm_mon:02d}", f"{t.tm_mday:02d}")
        os.makedirs(day, exist_ok=True)
        path = os.path.join(day, f"rollout-{time.strftime('%Y-%m-%dT%H-%M-%S', t)}-{sid}.jsonl")
        out: list[str] = []
        ms = start
        n = 0

        def rec(kind: str, payload: dict[str, Any], events: int = 0, etype: str | None = None) -> None:
            nonlocal ms, n
            out.append(json.dumps({"timestamp": _ts(ms), "type": kind, "payload": payload}, ensure_ascii=False,
                                  separators=(",", ":")))
            if events:
                n += events
                self.types[etype] = self.types.get(etype, 0) + events
            ms += rng.randrange(50, 8000)

        rec("session_meta", {"id": sid, "timestamp": _ts(start), "cwd": cwd, "originator": "codex_cli_rs",
                             "cli_version": "0.46.0", "source": "cli", "model_provider": "openai",
                             "git": {"commit_hash": f"{rng.getrandbits(160):040x}", "branch": rng.choice(
                                 ["main", "dev", f"feat/{self.w()}-{self.w()}", f"fix/{self.w()}"])}})
        rec("response_item", {"type": "message", "role": "user", "content": [{"type": "input_text", "text": (
            f"<environment_context>\n  <cwd>{cwd}</cwd>\n  <approval_policy>on-request</approval_policy>\n"
            "  <sandbox_mode>workspace-write</sandbox_mode>\n  <shell>bash</shell>\n</environment_context>")}]})
        rec("turn_context", {"cwd": cwd, "approval_policy": "on-request", "model": model, "effort": "medium",
                             "summary": "auto"})
        first = True
        while n < target:
            prompt = self.prompt(proj, ja)
            rec("response_item", {"type": "message", "role": "user",
                                  "content": [{"type": "input_text", "text": prompt}]}, 1, "user_input")
            rec("event_msg", {"type": "user_message", "message": prompt, "kind": "plain", "images": []})
            first = False
            chat = rng.random() < 0.2
            for _ in range(0 if chat else rng.choice([0, 1, 1, 2, 2, 3, 3, 4, 5, 6])):
                if rng.random() < 0.6:
                    self.reasoning(rec, proj)
                self.tool(rec, proj, cwd, ms)
            if rng.random() < 0.015:
                rec("event_msg", {"type": "turn_aborted", "reason": "interrupted"}, 1, "system")
                continue
            answer = self.answer(proj, ja, chat)
            rec("response_item", {"type": "message", "role": "assistant",
                                  "content": [{"type": "output_text", "text": answer}]}, 1, "assistant_response")
            rec("event_msg", {"type": "agent_message", "message": answer})
            rec("event_msg", {"type": "token_count", "info": {"total_token_usage": {
                "input_tokens": rng.randrange(10**5), "cached_input_tokens": rng.randrange(10**5),
                "output_tokens": rng.randrange(10**4), "total_tokens": rng.randrange(10**5)}}})
        assert not first
        data = ("\n".join(out) + "\n").encode("utf-8")
        with open(path, "wb") as f:
            f.write(data)
        self.bytes += len(data)
        self.files += 1
        self.sessions += 1
        self.events += n

    def prompt(self, proj: tuple[str, str], ja: bool) -> str:
        rng = self.rng
        if ja:
            picks = rng.sample(_JA, rng.randint(1, 2))
            if rng.random() < 0.3:
                self.q_ja.append(picks[0][1])
            return "".join(p[0] for p in picks) + (f" 対象は {self.file(proj)} です。" if rng.random() < 0.5 else "")
        s = self.sentence()
        k = rng.randrange(7)
        f, fn = self.file(proj), self.func()
        text = [s,
                f"Fix the failing test in {f}. {s}",
                f"Why does {fn} return None when the {self.w()} is empty? {s}",
                f"Add a --{rng.choice(_FLAGS)} option to the `{proj[0]} {rng.choice(_VERBS)}` command, with a test.",
                f"Refactor {f} so that {fn} no longer touches the {self.w()} {self.w()}.",
                f"Run the tests and tell me what fails. {s}",
                f"Can you look into the {self.w()} {self.w()} regression in {f}? {s}"][k]
        if rng.random() < 0.35:
            words = [x for x in re.findall(r"[A-Za-z][A-Za-z_']{3,}", text) if x.lower() not in _STOP]
            if len(words) >= 2:
                self.q_prompt.append(" ".join(rng.sample(words, min(len(words), rng.randint(2, 4)))))
        return text

    def answer(self, proj: tuple[str, str], ja: bool, chat: bool) -> str:
        rng = self.rng
        if ja:
            return self._fill(rng.choice(_JA_ANSWERS), proj)
        if chat:
            return " ".join(self.sentence() for _ in range(rng.randint(1, 3)))
        return rng.choice([
            f"Fixed `{self.func()}` in `{self.file(proj)}`: the {self.w()} was not {rng.choice(_VERBS)}d before use. "
            f"All tests pass now.",
            f"Added the option and a test in `{self.file(proj)}`. {self.sentence()}",
            f"The failure comes from `{self.func()}`; I changed it to {rng.choice(_VERBS)} the {self.w()} lazily "
            f"and updated `{self.file(proj)}`.",
            f"Done. Summary:\n- {self.sentence()}\n- updated `{self.file(proj)}`\n- {self.sentence()}",
        ])

    def reasoning(self, rec: Any, proj: tuple[str, str]) -> None:
        rng = self.rng
        if rng.random() < 0.15:
            rec("response_item", {"type": "reasoning", "summary": [], "content": None,
                                  "encrypted_content": f"gAAAA{rng.getrandbits(256):064x}"}, 1, "reasoning")
            return
        text = (f"**{rng.choice(_VERBS).capitalize()}ing the {self.w()} {self.w()}**\n\n"
                f"I need to check `{self.func()}` in `{self.file(proj)}` first. {self.sentence()}")
        rec("response_item", {"type": "reasoning", "summary": [{"type": "summary_text", "text": text}],
                              "content": None, "encrypted_content": f"gAAAA{rng.getrandbits(128):032x}"},
            1, "reasoning")

    def tool(self, rec: Any, proj: tuple[str, str], cwd: str, ms: int) -> None:
        rng = self.rng
        call_id = f"call_{rng.getrandbits(64):016x}"
        lang = proj[1]
        if rng.random() < 0.25:
            f = self.file(proj)
            lines = ["*** Begin Patch", f"*** Update File: {f}", f"@@ def {self.func()}():"]
            for _ in range(rng.randint(1, 12)):
                lines.append(f"-    {self.w()} = {self.func()}({self.w()})")
                lines.append(f"+    {self.w()} = {self.func()}({self.w()}, {self.w()}={self.w()})")
            if rng.random() < 0.3:
                lines += [f"*** Add File: {self.file(proj)}"] + [f"+{self.filler_line(proj, ms)}"
                                                                for _ in range(rng.randint(3, 30))]
            lines.append("*** End Patch")
            rec("response_item", {"type": "custom_tool_call", "status": "completed", "call_id": call_id,
                                  "name": "apply_patch", "input": "\n".join(lines) + "\n"}, 1, "tool_call")
            out = f"Success. Updated the following files:\nM {f}\n"
            rec("response_item", {"type": "custom_tool_call_output", "call_id": call_id, "output": json.dumps(
                {"output": out, "metadata": {"exit_code": 0, "duration_seconds": 0.0}})}, 1, "tool_response")
            return
        test = {"python": "python -m pytest -q", "rust": "cargo test", "typescript": "npx tsc --noEmit && npm test",
                "go": "go test ./...", "c": "make test"}[lang]
        cmd = rng.choice([test, test, f"rg -n '{self.func()}' {self.file(proj).rsplit('/', 1)[0]}",
                          f"sed -n '1,{rng.randrange(40, 400)}p' {self.file(proj)}", "git diff --stat",
                          f"git log --oneline -n {rng.randrange(5, 50)}", f"ls -la {self.file(proj).rsplit('/', 1)[0]}",
                          f"tail -n 200 logs/{self.w()}.log"])
        rec("response_item", {"type": "function_call", "name": "shell", "call_id": call_id, "arguments": json.dumps(
            {"command": ["bash", "-lc", cmd], "workdir": cwd, "timeout_ms": 120000})}, 1, "tool_call")
        fail = cmd == test and rng.random() < 0.45 or rng.random() < 0.05
        text, query = self.output(proj, ms, fail)
        if query:
            self.q_error.append(query)
        self.max_output = max(self.max_output, len(text.encode()))
        code = rng.choice([1, 2, 101]) if fail else 0
        if rng.random() < 0.5:
            output = f"Exit code: {code}\nWall time: {rng.randrange(1, 400) / 10} seconds\nOutput:\n{text}"
        else:
            output = json.dumps({"output": text, "metadata": {"exit_code": code,
                                                             "duration_seconds": rng.randrange(1, 400) / 10}})
        rec("response_item", {"type": "function_call_output", "call_id": call_id, "output": output}, 1, "tool_response")

    def generate(self) -> None:
        i = 0
        while self.events < self.n_target:
            self.session(i)
            i += 1

    def queries(self, n: int, seed: int = 3) -> list[tuple[str, list[str] | None, str]]:
        """(query, event_types or None for the default, kind): ~55% prompt words, ~35% error lines
        searched among tool responses, ~10% Japanese keywords (as many as the corpus has)."""
        rng = random.Random(seed)
        n_ja = min(len(self.q_ja), max(1, n // 10)) if self.q_ja else 0
        n_err = min(len(self.q_error), int(n * 0.35))
        n_pr = min(len(self.q_prompt), n - n_ja - n_err)
        out = [(q, None, "prompt") for q in rng.sample(self.q_prompt, n_pr)]
        out += [(q, ["tool_response"], "error") for q in rng.sample(self.q_error, n_err)]
        out += [(q, None, "japanese") for q in rng.sample(self.q_ja, n_ja)]
        rng.shuffle(out)
        return out


# ================================================================================ the daemon

def start_daemon(data_dir: str, log_path: str, profile: str | None = None,
                 timeout: float = 1800.0) -> tuple[subprocess.Popen, float]:
    """``python -m storaged`` (under cProfile if ``profile``), waiting until it answers ping as loaded."""
    return common.start_daemon(data_dir, default_endpoint(data_dir), timeout, log_path, profile)


class Req:
    """The daemon protocol over one REQ socket, as bench/e2e.py uses it."""

    def __init__(self, data_dir: str) -> None:
        self.sock = zmq.Context.instance().socket(zmq.REQ)
        self.sock.connect(default_endpoint(data_dir))

    def call(self, op: str, args: dict[str, Any]) -> tuple[float, dict[str, Any]]:
        t0 = time.perf_counter()
        self.sock.send(encode_request(op, args, str(ULID())))
        reply = decode(self.sock.recv(), max_bytes=1 << 30)
        return time.perf_counter() - t0, reply

    def close(self) -> None:
        self.sock.close(linger=0)


def ingest(corpus_dir: str, data_dir: str, home: str, profile: str | None) -> tuple[float, dict[str, Any]]:
    env = dict(os.environ, HOME=home, CODEX_HOME=corpus_dir, PYTHONPATH=REPO)
    for k in ("CONVMEM_ENDPOINT", "CONVMEM_DATA_DIR", "CLAUDE_CONFIG_DIR"):
        env.pop(k, None)
    cmd = INGEST_CMD if not profile else [sys.executable, "-m", "cProfile", "-o", profile, "-m", "ingest"]
    t0 = time.perf_counter()
    p = subprocess.run([*cmd, "--data-dir", data_dir, "--no-spawn", "--once", "--harness", "codex",
                        "--timeout", "600", "--log-level", "WARNING"], capture_output=True, text=True, env=env, cwd=REPO)
    dt = time.perf_counter() - t0
    if p.returncode != 0:
        raise RuntimeError(f"convmem-ingest failed ({p.returncode}): {p.stderr[-3000:]}")
    return dt, json.loads(p.stdout.strip().splitlines()[-1])


# ================================================================================ the SQLite baseline

class SqliteHistory:
    """The same events in SQLite: an events table and an external-content FTS5 index over it."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.db = sqlite3.connect(path, isolation_level=None)
        self.db.execute("PRAGMA journal_mode=WAL")
        self.db.execute("PRAGMA synchronous=FULL")
        self.db.execute("CREATE TABLE IF NOT EXISTS events (id INTEGER PRIMARY KEY, message_id TEXT UNIQUE NOT NULL, "
                        "session_id TEXT NOT NULL, turn INTEGER NOT NULL, etype TEXT NOT NULL, tool TEXT, "
                        "ts INTEGER NOT NULL, content TEXT NOT NULL)")
        self.db.execute("CREATE INDEX IF NOT EXISTS by_turn ON events(session_id, turn, id)")
        self.db.execute("CREATE VIRTUAL TABLE IF NOT EXISTS fts USING fts5(content, etype UNINDEXED, "
                        "session_id UNINDEXED, content='events', content_rowid='id', tokenize='porter unicode61')")

    def load(self, corpus_dir: str, batch: int = 1000) -> int:
        """Read and parse every rollout as the ingester does, insert 1000 events per transaction."""
        from ingest import codex, reader
        from ingest.service import EMPTY_OUTPUT, _walk, derived_ulid

        rows: list[tuple[Any, ...]] = []
        total = 0

        def flush() -> None:
            self.insert(rows)
            rows.clear()

        for path in sorted(_walk(os.path.join(corpus_dir, "sessions"), "rollout-*.jsonl")):
            fd, st = reader.open_regular(path)
            try:
                info = codex.new_info(path)
                turn = 0
                for line in reader.read_lines(fd, 0, st.st_size):
                    if line.obj is None:
                        continue
                    for ev in codex.parse_line(line.obj, info, line.offset):
                        text = ev.text if ev.text and ev.text.strip() else (
                            EMPTY_OUTPUT if ev.type == "tool_response" else "{}" if ev.type == "tool_call" else None)
                        if text is None:
                            continue
                        if ev.type == "user_input":
                            turn += 1
                        sid = f"codex:{ev.session or info.session_id}"
                        mid = derived_ulid(ev.ts_ms, f"codex:{ev.session or info.session_id}:{ev.key}")
                        rows.append((mid, sid, turn, ev.type, ev.tool_name, ev.ts_ms, text))
                        total += 1
                        if len(rows) >= batch:
                            flush()
            finally:
                os.close(fd)
        if rows:
            flush()
        return total

    def insert(self, rows: list[tuple[Any, ...]]) -> None:
        """One transaction: (message_id, session_id, turn, etype, tool, ts, content) rows and their FTS rows."""
        cur = self.db.cursor()
        cur.execute("BEGIN")
        for r in rows:
            cur.execute("INSERT OR IGNORE INTO events(message_id, session_id, turn, etype, tool, ts, content) "
                        "VALUES (?,?,?,?,?,?,?)", r)
            if cur.rowcount:
                cur.execute("INSERT INTO fts(rowid, content, etype, session_id) VALUES (?,?,?,?)",
                            (cur.lastrowid, r[6], r[3], r[1]))
        cur.execute("COMMIT")

    def size(self) -> int:
        return sum(os.path.getsize(self.path + x) for x in ("", "-wal") if os.path.exists(self.path + x))

    def search(self, fq: str | None, types: list[str] | None, n: int) -> list[tuple[Any, ...]]:
        """Top n by bm25 with a snippet; ``types`` None: every event type (no filter)."""
        if not fq:
            return []
        where = f"AND etype IN ({','.join('?' * len(types))}) " if types else ""
        return self.db.execute(
            f"SELECT rowid, session_id, etype, snippet(fts, 0, '', '', '…', 32) FROM fts WHERE fts MATCH ? "
            f"{where}ORDER BY rank LIMIT ?", (fq, *(types or ()), n + 1)).fetchall()[:n]

    def open_event(self, mid: str) -> Any:
        return self.db.execute("SELECT * FROM events WHERE message_id=?", (mid,)).fetchone()

    def open_turn(self, sid: str, turn: int, limit: int | None) -> Any:
        """The turn's summary (first user input, final response, tools) and, with a limit, a page of
        compact events, from one range scan."""
        rows = self.db.execute("SELECT message_id, etype, tool, ts, substr(content, 1, 240) FROM events "
                               "WHERE session_id=? AND turn=? ORDER BY id", (sid, turn)).fetchall()
        summary = (rows[0], rows[-1], sorted({r[2] for r in rows if r[2]}), len(rows))
        return summary, rows[:limit] if limit else []

    def open_session(self, sid: str) -> Any:
        return self.db.execute("SELECT count(*), min(ts), max(ts), max(turn) FROM events WHERE session_id=?",
                               (sid,)).fetchone()

    def key_of(self, mid: str) -> tuple[str, int] | None:
        row = self.db.execute("SELECT session_id, turn FROM events WHERE message_id=?", (mid,)).fetchone()
        return (row[0], row[1]) if row else None

    def close(self) -> None:
        self.db.close()


def fts_query(q: str) -> str | None:
    """Our query as FTS5 sees it: its words (our stop words dropped) OR-ed; a CJK run as one phrase."""
    from storaged.tokenize import STOP_WORDS

    words = []
    for w in re.findall(r"[^\W_]+", q.casefold()):
        if w and w not in STOP_WORDS:
            words.append(f'"{w}"')
    return " OR ".join(dict.fromkeys(words)) or None


# ================================================================================ measurements

def summary(seconds: list[float]) -> dict[str, Any]:
    ms = [x * 1000 for x in seconds]
    if not ms:
        return {"p50_ms": None, "p95_ms": None, "n": 0}
    return {"p50_ms": round(statistics.median(ms), 3), "p95_ms": round(pct(ms, 95), 3), "n": len(ms)}


def _ratio(a: Any, b: Any) -> float | None:
    return round(a / b, 2) if isinstance(a, (int, float)) and isinstance(b, (int, float)) and b else None


def pair(ours: list[float], theirs: list[float]) -> dict[str, Any]:
    o, s = summary(ours), summary(theirs)
    return {"ours": o, "sqlite": s, "ratio_p50": _ratio(o["p50_ms"], s["p50_ms"]),
            "ratio_p95": _ratio(o["p95_ms"], s["p95_ms"])}


def search_and_open(req: Req, lite: SqliteHistory, queries: list[tuple[str, list[str] | None, str]],
                    n_hits: int, n_opens: int) -> dict[str, Any]:
    default = ["user_input", "assistant_response"]
    # the daemon indexes an import in the background: searches are answered busy (retryable, with a
    # hint) until it has caught up — what a host sees after a bulk import; wait for it, as a host retries
    deadline = time.monotonic() + 300
    while True:
        _dt, r = req.call("search_sessions", {"query": "warm up"})
        err = r.get("error") or {}
        if r.get("status") == "OK" or not err.get("retryable") or time.monotonic() > deadline:
            break
        time.sleep(err.get("retry_after_ms", 250) / 1000)
    # warm-up, and what each side finds
    found = {"ours": 0, "fts5": 0}
    found_by_kind: dict[str, list[int]] = {}
    targets: list[str] = []
    for q, types, kind in queries:
        args: dict[str, Any] = {"query": q, "n_hits": n_hits}
        if types:
            args["event_types"] = types
        _dt, r = req.call("search_sessions", args)
        assert r.get("status") == "OK", r
        res = r["data"]["results"]
        hit_fts = bool(lite.search(fts_query(q), types or default, n_hits))
        found["ours"] += bool(res)
        found["fts5"] += hit_fts
        k = found_by_kind.setdefault(kind, [0, 0, 0])
        k[0] += 1
        k[1] += bool(res)
        k[2] += hit_fts
        if res:
            targets.append(res[0]["open"]["event_id"])
    lat: dict[str, tuple[list[float], list[float]]] = {"all": ([], []), "prompt": ([], []), "error": ([], []),
                                                       "japanese": ([], [])}
    for q, types, kind in queries:
        args = {"query": q, "n_hits": n_hits}
        if types:
            args["event_types"] = types
        dt, _r = req.call("search_sessions", args)
        fq = fts_query(q)
        t0 = time.perf_counter()
        lite.search(fq, types or default, n_hits)
        ds = time.perf_counter() - t0
        for key in ("all", kind):
            lat[key][0].append(dt)
            lat[key][1].append(ds)
    ping = [req.call("ping", {})[0] for _ in range(100)]
    out: dict[str, Any] = {"queries": len(queries), "n_hits": n_hits, "queries_with_results": found,
                           "queries_with_results_by_kind": {k: {"queries": v[0], "ours": v[1], "fts5": v[2]}
                                                            for k, v in found_by_kind.items()},
                           "ping_round_trip": summary(ping)}
    for k, (o, s) in lat.items():
        if o:
            out[f"search_{k}"] = pair(o, s)
    # open: the top hits' events, their turns and sessions (ids from our search, keys for SQLite by message_id)
    rng = random.Random(9)
    picks = [targets[rng.randrange(len(targets))] for _ in range(n_opens)] if targets else []
    plan = []
    for eid in picks:
        _dt, r = req.call("open", {"id": eid})
        assert r.get("status") == "OK", r
        ev = r["data"]["event"]
        key = lite.key_of(ev["message_id"])
        if key:
            plan.append((eid, ev["turn_id"], ev["session_id"], ev["message_id"], key, ev["content_bytes"]))
    ops: dict[str, tuple[list[float], list[float]]] = {k: ([], []) for k in
                                                      ("open_event", "open_turn", "open_turn_limit20", "open_session")}
    content_bytes = []
    for eid, tid, sid, mid, (lsid, lturn), cb in plan:
        content_bytes.append(cb)
        for name, args, fn in (
                ("open_event", {"id": eid}, lambda: lite.open_event(mid)),
                ("open_turn", {"id": tid}, lambda: lite.open_turn(lsid, lturn, None)),
                ("open_turn_limit20", {"id": tid, "limit": 20}, lambda: lite.open_turn(lsid, lturn, 20)),
                ("open_session", {"id": sid}, lambda: lite.open_session(lsid))):
            dt, r = req.call("open", args)
            assert r.get("status") == "OK", r
            t0 = time.perf_counter()
            fn()
            ops[name][1].append(time.perf_counter() - t0)
            ops[name][0].append(dt)
    for k, (o, s) in ops.items():
        out[k] = pair(o, s)
    if content_bytes:
        out["opened_event_content_bytes"] = {"p50": statistics.median(content_bytes), "max": max(content_bytes)}
    return out


async def _agent_bytes(data_dir: str, questions: list[tuple[str, list[str] | None, str]]) -> dict[str, Any]:
    from mcp import Client, StdioServerParameters

    params = StdioServerParameters(command=sys.executable, args=["-m", "mcpfront", "--data-dir", data_dir,
                                                                "--no-spawn"], cwd=REPO)

    def size(r: Any) -> tuple[int, int]:
        sc = r.structured_content
        s = len(json.dumps(sc, ensure_ascii=False, separators=(",", ":")).encode()) if sc is not None else 0
        t = sum(len(c.text.encode()) for c in r.content if getattr(c, "type", "") == "text")
        return s, t

    rows = []
    async with Client(params, mode="legacy") as client:
        await client.call_tool("get_ingest_status", {})
        for q, types, kind in questions:
            args: dict[str, Any] = {"query": q, "n_hits": 10}
            if types:
                args["event_types"] = types
            r1 = await client.call_tool("search_sessions", args)
            assert not r1.is_error, r1
            s1, t1 = size(r1)
            results = (r1.structured_content or {}).get("data", {}).get("results", [])
            s2 = t2 = 0
            if results:
                r2 = await client.call_tool("open", {"id": results[0]["open"]["event_id"]})
                assert not r2.is_error, r2
                s2, t2 = size(r2)
            r3 = await client.call_tool("search_messages", {"query": q, "limit": 10})
            assert not r3.is_error, r3
            s3, t3 = size(r3)
            rows.append({"kind": kind, "history_structured": s1 + s2, "history_text": t1 + t2,
                         "history_search_structured": s1, "history_search_text": t1, "open_structured": s2,
                         "open_text": t2, "memory_structured": s3, "memory_text": t3,
                         "memory_results": len((r3.structured_content or {}).get("results", []) or [])})

    def med(k: str) -> float:
        return statistics.median(r[k] for r in rows) if rows else float("nan")

    out: dict[str, Any] = {"questions": len(rows)}
    for k in ("history_structured", "history_text", "history_search_structured", "history_search_text",
              "open_structured", "open_text", "memory_structured", "memory_text"):
        out[f"{k}_p50"] = med(k)
    for k in ("history_structured", "history_text", "memory_structured", "memory_text"):
        out[f"{k}_p95"] = pct([r[k] for r in rows], 95) if rows else float("nan")
    tot_h = [r["history_structured"] + r["history_text"] for r in rows]
    tot_m = [r["memory_structured"] + r["memory_text"] for r in rows]
    out["history_total_p50"] = statistics.median(tot_h) if rows else float("nan")
    out["memory_total_p50"] = statistics.median(tot_m) if rows else float("nan")
    out["per_question_ratio_p50"] = round(statistics.median(m / h for h, m in zip(tot_h, tot_m) if h), 2) \
        if rows else float("nan")
    for kind in sorted({r["kind"] for r in rows}):
        sub = [(h, m) for r, h, m in zip(rows, tot_h, tot_m) if r["kind"] == kind]
        out[f"by_kind_{kind}"] = {"questions": len(sub), "history_total_p50": statistics.median(h for h, _ in sub),
                                  "memory_total_p50": statistics.median(m for _, m in sub)}
    out["rows"] = rows
    return out


def _profile_top(path: str, n: int = 25) -> list[str]:
    import io
    import pstats

    if not os.path.exists(path):
        return [f"(no profile written at {path})"]
    s = io.StringIO()
    pstats.Stats(path, stream=s).sort_stats("cumulative").print_stats(n)
    return s.getvalue().splitlines()


def run_size(n: int, tmp: str, a: argparse.Namespace, agent: bool) -> dict[str, Any]:
    res: dict[str, Any] = {"size": n}
    corpus_dir = os.path.join(tmp, f"codex{n}")
    t0 = time.perf_counter()
    c = Corpus(corpus_dir, n, seed=a.seed)
    c.generate()
    res["corpus"] = {"events": c.events, "sessions": c.sessions, "files": c.files, "bytes": c.bytes,
                     "event_types": c.types, "max_tool_output_bytes": c.max_output, "generate_s": round(
                         time.perf_counter() - t0, 2), "query_candidates": {"prompt": len(c.q_prompt),
                                                                             "error": len(c.q_error),
                                                                             "japanese": len(c.q_ja)}}
    print(f"[history] {n}: corpus {c.events} events, {c.sessions} sessions, {c.bytes / 2**20:.1f} MiB in "
          f"{res['corpus']['generate_s']} s", file=sys.stderr, flush=True)
    queries = c.queries(a.queries)
    data_dir = os.path.join(tmp, f"d{n}")
    home = os.path.join(tmp, "home")
    os.makedirs(home, exist_ok=True)
    log_path = os.path.join(tmp, f"daemon{n}.log")
    prof_d = os.path.join(a.profile, f"daemon-{n}.prof") if a.profile else None
    prof_i = os.path.join(a.profile, f"ingest-{n}.prof") if a.profile else None
    proc, _ = start_daemon(data_dir, log_path, prof_d)
    lite = None
    try:
        os.sync()
        wall, totals = ingest(corpus_dir, data_dir, home, prof_i)
        res["ingest"] = {"wall_s": round(wall, 2), "events_per_s": round(c.events / wall, 1),
                         "mib_per_s": round(c.bytes / 2**20 / wall, 2), "totals": totals}
        if totals.get("imported") != c.events:
            res["ingest"]["mismatch"] = f"generated {c.events} events, ingester imported {totals.get('imported')}"
        gc.collect()
        res["daemon"] = {"rss_after_ingest_bytes": rss_bytes(proc.pid)}
        print(f"[history] {n}: ingest {wall:.1f} s ({c.events / wall:,.0f} events/s)", file=sys.stderr, flush=True)
        # SQLite beside it (the daemon idles meanwhile)
        db_path = os.path.join(tmp, f"h{n}.sqlite")
        lite = SqliteHistory(db_path)
        t0 = time.perf_counter()
        loaded = lite.load(corpus_dir)
        t_sql = time.perf_counter() - t0
        res["sqlite_load"] = {"wall_s": round(t_sql, 2), "events": loaded, "events_per_s": round(loaded / t_sql, 1),
                              "mib_per_s": round(c.bytes / 2**20 / t_sql, 2), "db_bytes": lite.size()}
        print(f"[history] {n}: SQLite load {t_sql:.1f} s", file=sys.stderr, flush=True)
        req = Req(data_dir)
        try:
            _dt, h = req.call("get_system_health", {})
            res["daemon"]["log_bytes"] = h.get("log_size")
            res["daemon"]["active_messages"] = h.get("active_messages")
            res["latency"] = search_and_open(req, lite, queries, 10, a.opens)
        finally:
            req.close()
        print(f"[history] {n}: searches done", file=sys.stderr, flush=True)
        t0 = time.perf_counter()
        stop(proc, timeout=1800)
        res["daemon"]["stop_with_snapshot_s"] = round(time.perf_counter() - t0, 2)
        if a.profile:
            res["profile_daemon_top"] = _profile_top(prof_d)
            res["profile_ingest_top"] = _profile_top(prof_i)
        snap = os.path.join(data_dir, "snapshot")
        res["daemon"]["snapshot_bytes"] = os.path.getsize(snap) if os.path.exists(snap) else None
        proc, ready = start_daemon(data_dir, log_path)
        res["daemon"]["start_from_snapshot_s"] = round(ready, 3)
        res["daemon"]["rss_after_start_bytes"] = rss_bytes(proc.pid)
        lite.close()
        t0 = time.perf_counter()
        db = sqlite3.connect(db_path)
        db.execute("SELECT count(*) FROM events").fetchone()
        res["sqlite_open_count_s"] = round(time.perf_counter() - t0, 3)
        db.close()
        lite = None
        if agent:
            rng = random.Random(11)
            sample = rng.sample(queries, min(a.agent_questions, len(queries)))
            res["agent_bytes"] = asyncio.run(_agent_bytes(data_dir, sample))
            print(f"[history] {n}: agent bytes done", file=sys.stderr, flush=True)
    finally:
        if lite is not None:
            lite.close()
        stop(proc, timeout=1800)
    if not a.keep:
        shutil.rmtree(corpus_dir, ignore_errors=True)
        shutil.rmtree(data_dir, ignore_errors=True)
        for x in ("", "-wal", "-shm"):
            p = os.path.join(tmp, f"h{n}.sqlite{x}")
            if os.path.exists(p):
                os.unlink(p)
    return res


def table_rows(results: list[dict[str, Any]]) -> list[list[Any]]:
    rows: list[list[Any]] = []

    def row(figure: str, ours: Any, base: Any, unit: str) -> None:
        rows.append([figure, ours, base, _ratio(ours, base) if base not in ("", None) else "", unit])

    for r in results:
        n = f"{r['size']:,}"
        if "ingest" not in r:
            continue
        i, s = r["ingest"], r["sqlite_load"]
        row(f"history ingest at {n} events", i["events_per_s"], s["events_per_s"], "events/s")
        row(f"history ingest at {n} ({r['corpus']['bytes'] / 2**20:.0f} MiB transcripts)", i["mib_per_s"],
            s["mib_per_s"], "MiB/s")
        lat = r.get("latency", {})
        for key, label in (("search_all", "search_sessions"), ("search_prompt", "search_sessions, prompt words"),
                           ("search_error", "search_sessions, tool_response errors"),
                           ("search_japanese", "search_sessions, Japanese")):
            if key in lat:
                kind = key.split("_", 1)[1]
                none = lat.get("queries_with_results_by_kind", {}).get(kind, {}).get("fts5") == 0
                for p in ("p50", "p95"):
                    row(f"{label} at {n} {p}" + (" (FTS5 finds nothing)" if none else ""),
                        lat[key]["ours"][f"{p}_ms"], lat[key]["sqlite"][f"{p}_ms"], "ms")
        for key, label in (("open_event", "open event"), ("open_turn", "open turn (id only)"),
                           ("open_turn_limit20", "open turn limit 20"), ("open_session", "open session (id only)")):
            if key in lat:
                row(f"{label} at {n} p50", lat[key]["ours"]["p50_ms"], lat[key]["sqlite"]["p50_ms"], "ms")
                row(f"{label} at {n} p95", lat[key]["ours"]["p95_ms"], lat[key]["sqlite"]["p95_ms"], "ms")
        if "ping_round_trip" in lat:
            row(f"  daemon ping round trip at {n} p50 (IPC floor)", lat["ping_round_trip"]["p50_ms"], "", "ms")
        d = r.get("daemon", {})
        if "rss_after_ingest_bytes" in d:
            row(f"daemon RSS after ingest at {n} (SQLite: db file)", round(d["rss_after_ingest_bytes"] / 2**20, 1),
                round(s["db_bytes"] / 2**20, 1), "MiB")
        if "start_from_snapshot_s" in d:
            row(f"daemon start-up at {n} (snapshot; SQLite: open+count)", d["start_from_snapshot_s"],
                r.get("sqlite_open_count_s", ""), "s")
        ab = r.get("agent_bytes")
        if ab:
            row(f"agent bytes at {n}: structuredContent, search_sessions+open vs search_messages p50",
                ab["history_structured_p50"], ab["memory_structured_p50"], "B (SQLite col: search_messages)")
            row(f"agent bytes at {n}: text content, search_sessions+open vs search_messages p50",
                ab["history_text_p50"], ab["memory_text_p50"], "B (SQLite col: search_messages)")
            row(f"agent bytes at {n}: both, search_sessions+open vs search_messages p50",
                ab["history_total_p50"], ab["memory_total_p50"], "B (SQLite col: search_messages)")
    return rows


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--sizes", default="100000", help="comma-separated corpus sizes in events (default 100000)")
    p.add_argument("--queries", type=int, default=300, help="search queries per size")
    p.add_argument("--opens", type=int, default=200, help="open targets per size (each opened 4 ways)")
    p.add_argument("--agent-questions", type=int, default=30, help="questions for the MCP bytes figure")
    p.add_argument("--seed", type=int, default=42)
    p.add_argument("--quick", action="store_true", help="2k events, few queries: a smoke run")
    p.add_argument("--keep", action="store_true", help="keep the work directory (corpus, data dir, SQLite)")
    p.add_argument("--profile", metavar="DIR", help="run daemon and ingester under cProfile, stats into DIR")
    p.add_argument("--json")
    a = p.parse_args(argv)
    if a.quick:
        sizes = [2000]
        a.queries, a.opens, a.agent_questions = min(a.queries, 40), min(a.opens, 20), min(a.agent_questions, 4)
    else:
        sizes = [int(x) for x in a.sizes.split(",")]
    if a.profile:
        os.makedirs(a.profile, exist_ok=True)
        a.profile = os.path.abspath(a.profile)
    tmp = tempfile.mkdtemp(prefix="cvhist-")
    results = []
    try:
        for n in sizes:
            results.append(run_size(n, tmp, a, agent=(n == min(sizes))))
    finally:
        if not a.keep:
            shutil.rmtree(tmp, ignore_errors=True)
        else:
            print(f"[history] kept {tmp}", file=sys.stderr)
    out = {"results": results, "quick": a.quick}
    for r in results:
        c, i, s = r["corpus"], r["ingest"], r["sqlite_load"]
        lat = r["latency"]
        print(f"\n# {r['size']:,} events: {c['sessions']:,} sessions, {c['bytes'] / 2**20:.1f} MiB of rollouts, "
              f"largest tool output {c['max_tool_output_bytes']:,} B; types {c['event_types']}")
        print(f"  ingest {i['wall_s']} s ({i['totals'].get('imported')} imported, {i['totals'].get('redacted')} "
              f"redactions); SQLite load {s['wall_s']} s; queries with results (ours / FTS5): "
              + ", ".join(f"{k} {v['ours']}/{v['fts5']} of {v['queries']}"
                          for k, v in lat.get("queries_with_results_by_kind", {}).items()))
        if lat.get("queries_with_results_by_kind", {}).get("japanese", {}).get("fts5") == 0:
            print("  (FTS5 porter unicode61 keeps a CJK run as one token: Japanese keywords find nothing there, so "
                  "its Japanese latency is that of an empty search)")
        d = r["daemon"]
        print(f"  daemon: RSS after ingest {d['rss_after_ingest_bytes'] / 2**20:.0f} MiB, after start "
              f"{d['rss_after_start_bytes'] / 2**20:.0f} MiB; log {(d.get('log_bytes') or 0) / 2**20:.0f} MiB, "
              f"snapshot {(d.get('snapshot_bytes') or 0) / 2**20:.0f} MiB; stop+snapshot {d['stop_with_snapshot_s']} s")
        ab = r.get("agent_bytes")
        if ab:
            print(f"  agent bytes ({ab['questions']} questions, medians): search_sessions+open structured "
                  f"{ab['history_structured_p50']:,.0f} B + text {ab['history_text_p50']:,.0f} B "
                  f"(search {ab['history_search_structured_p50']:,.0f}+{ab['history_search_text_p50']:,.0f}, open "
                  f"{ab['open_structured_p50']:,.0f}+{ab['open_text_p50']:,.0f}); search_messages structured "
                  f"{ab['memory_structured_p50']:,.0f} B + text {ab['memory_text_p50']:,.0f} B; "
                  f"per-question ratio (search_messages / history, total) p50 {ab['per_question_ratio_p50']}")
            print("    by kind (total bytes, medians): " + "; ".join(
                f"{k[8:]} {v['questions']} q: history {v['history_total_p50']:,.0f} vs search_messages "
                f"{v['memory_total_p50']:,.0f}" for k, v in ab.items() if k.startswith("by_kind_")))
        for key in ("profile_ingest_top", "profile_daemon_top"):
            if key in r:
                print(f"\n  {key}:")
                print("\n".join("    " + x for x in r[key][:45]))
    print_table("Agent history: convmem vs SQLite (WAL, synchronous=FULL, FTS5 porter unicode61), same run",
                table_rows(results), ["figure", "convmem", "SQLite", "ratio", "unit"])
    print("search/open: convmem through the daemon protocol (REQ socket, msgpack); SQLite in process.")
    return write_json(a.json, out)


if __name__ == "__main__":
    main()
