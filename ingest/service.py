"""The ingester: follows every harness's transcript files and stores their events, exactly once.

One loop, a daemon client like any other. Per file it resumes from the checkpoint kept in the
daemon's store, parses what was appended (``claude``, ``codex``, ``gemini``), turns events into
messages — ids derived from the transcript, secrets redacted (``protocol.redact``), tool-call file
paths resolved to project roots (``workspace``) — and sends them in batches. Each batch carries the
file's new checkpoint and any changed session metadata, and the daemon writes all of it in one
durable append: killed at any moment, the ingester resumes where the store says it stopped, and
whatever it reads twice is skipped by id. So nothing is stored twice and nothing is missed. The
session facts a checkpoint keeps for resuming (title, summary, first prompt...) are redacted and
clipped like the session record: no secret reaches the log that way, and a checkpoint always fits
its size limit.

Between files (and every ``interval`` during a long backfill) it sends a heartbeat: files and bytes
discovered and done per source, so ``get_ingest_status`` can tell coverage and freshness. Files and
source names travel to the daemon; paths stay in checkpoints and never reach an agent.
"""
from __future__ import annotations

import asyncio
import glob
import hashlib
import json
import logging
import os
import stat
import time
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

import msgpack
from ulid import ULID

from daemonclient.replies import RETRY_AWAY, describe
from protocol import history as H
from protocol import limits as L
from protocol.redact import redact

from . import claude, codex, gemini, reader, workspace
from .events import Event, Malformed, SessionInfo

log = logging.getLogger("convmem.ingest")

MODULES = {claude.HARNESS: claude, codex.HARNESS: codex, gemini.HARNESS: gemini}
HARNESSES = tuple(MODULES)
DOCUMENT_HARNESSES = frozenset({gemini.HARNESS})
FILE_PATTERNS = {claude.HARNESS: "*.jsonl", codex.HARNESS: "rollout-*.jsonl", gemini.HARNESS: "session-*.json"}

BATCH_ENVELOPE_BYTES = 64 * L.KiB
# a batch is sent once it holds IMPORT_BATCH_PREFERRED_BYTES; with one more message (≤ 1 MiB of
# content) and its checkpoints it stays far below the request's limit
assert 2 * L.IMPORT_BATCH_PREFERRED_BYTES + BATCH_ENVELOPE_BYTES + H.CHECKPOINT_VALUE_MAX_BYTES <= L.MAX_REQUEST_BYTES
HEARTBEAT_INTERVAL_S = 10.0
HEARTBEAT_MS_MIN, HEARTBEAT_MS_MAX = 100, 3_600_000   # the interval a heartbeat may state (any --interval works)
QUIET_TAIL_S = 60.0           # an unfinished last line untouched this long no longer counts as backlog
FUTURE_SLACK_MS = 7 * 24 * 3600 * 1000
CALLS_KEPT = 64               # at most this many pending calls (no result yet) carried in a checkpoint
EMPTY_OUTPUT = "(no output)"
CUT_MARK = "\n[... cut by convmem import: the original was longer than 1 MiB]"


def derived_ulid(ms: int, key: str) -> str:
    """A ULID from the event's time and a hash of its identity: the same entry always gets the same id."""
    rand = int.from_bytes(hashlib.sha256(key.encode("utf-8", "surrogatepass")).digest()[:10], "big")
    ms = max(0, min(ms, L.TIME_MS_MAX))
    return str(ULID.from_bytes(((ms << 80) | rand).to_bytes(16, "big")))


def checkpoint_key(path: str) -> str:
    """A file's checkpoint key: its path as text the daemon can store. A name that is not UTF-8 (its
    bytes arrive as lone surrogates) keeps its odd bytes as ``\\xNN``, so names stay distinct."""
    return path if path.isascii() else os.fsencode(path).decode("utf-8", "backslashreplace")


def _utf8(text: str | None) -> str | None:
    """``text`` encodable as UTF-8, as ``clip_utf8`` makes it: lone surrogates (JSON can carry them,
    non-UTF-8 file names become them) are replaced."""
    if text is None or text.isascii():
        return text
    return text.encode("utf-8", "replace").decode("utf-8")


def clip_utf8(text: str, max_bytes: int, mark: str = "") -> str:
    """``text`` within ``max_bytes`` of UTF-8 (lone surrogates, which JSON can carry, become "?")."""
    data = text.encode("utf-8", "replace") if not text.isascii() else text.encode()
    if len(data) <= max_bytes:
        return data.decode("utf-8", "replace") if not text.isascii() else text
    keep = max_bytes - len(mark.encode())
    return data[:keep].decode("utf-8", "ignore") + mark


@dataclass
class Totals:
    files: int = 0
    lines: int = 0
    events: int = 0
    imported: int = 0
    existing: int = 0
    malformed: int = 0
    redacted: int = 0
    unreadable: int = 0
    malformed_at: list[str] = field(default_factory=list)

    def report(self) -> dict[str, Any]:
        out = asdict(self)
        out["malformed_at"] = self.malformed_at[:20]
        return out


class DaemonError(Exception):
    """The daemon refused a batch for a reason retrying will not fix."""


class Stopped(Exception):
    """SIGTERM/SIGINT arrived while a request was waiting for the daemon: the batch was not
    acknowledged, so the next run sends it again (its ids make that harmless)."""


@dataclass
class _Progress:
    """Per source, for the heartbeat."""
    files_total: int = 0
    files_completed: int = 0
    bytes_total: int = 0
    bytes_completed: int = 0
    errors: int = 0


class Ingester:
    def __init__(self, request: Callable[..., Any], harnesses: tuple[str, ...] = HARNESSES,
                 env: Mapping[str, str] | None = None, home: str | None = None,
                 paths: list[str] | None = None, interval: float = HEARTBEAT_INTERVAL_S,
                 progress: Callable[[int], None] | None = None, stop: asyncio.Event | None = None) -> None:
        self.request = request               # the daemon client's call: async (op, args, retry=...) -> reply
        self.harnesses = harnesses
        self.env = dict(os.environ if env is None else env)
        self.home = home or self.env.get("HOME") or os.path.expanduser("~")
        self.paths = paths
        self.interval = interval
        self.progress = progress
        self.stop = stop or asyncio.Event()
        self.instance = str(ULID())
        self.started_at = time.time_ns() // 1_000_000
        self.checkpoints: dict[tuple[str, str], dict[str, Any]] = {}
        self.sent_meta: dict[str, dict[str, Any]] = {}
        self.projects: dict[str | None, workspace.Project] = {}
        self.sources: dict[str, dict[str, Any]] = {}
        self.discovered = False
        self.last_heartbeat = 0.0
        self.doc_failures: dict[str, tuple[int, int]] = {}
        self.sender: _Sender | None = None   # the current pass's
        self.failed: set[str] = set()          # the current pass's files that could not be read

    # ------------------------------------------------------------------ the daemon
    async def call(self, op: str, args: dict[str, Any]) -> dict[str, Any]:
        """A request, retried by the daemon client while the daemon is busy (a rebuild) or away
        (restarting); a stop signal ends the wait at once (``Stopped``) instead of after the client's
        attempts run out."""
        reply = await self._or_stop(self.request(op, args, retry=RETRY_AWAY))
        if reply.get("status") == "ERROR":
            raise DaemonError(describe(op, reply))
        return reply

    async def _or_stop(self, aw: Any) -> Any:
        if self.stop.is_set():
            aw.close()
            raise Stopped()
        work = asyncio.ensure_future(aw)
        stop = asyncio.ensure_future(self.stop.wait())
        try:
            await asyncio.wait({work, stop}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            stop.cancel()
        if not work.done():
            work.cancel()
            raise Stopped()
        return work.result()

    async def load_checkpoints(self) -> None:
        for harness in self.harnesses:
            for source in MODULES[harness].SOURCES:
                reply = await self.call("ingest_checkpoints", {"source": source})
                for key, value in (reply.get("checkpoints") or {}).items():
                    self.checkpoints[(source, key)] = value

    def _heartbeat_args(self, final: bool = False) -> dict[str, Any]:
        sources = []
        for source, p in sorted(self.sources.items()):
            sources.append({"source": source, "harness": p["harness"], "discovery_complete": self.discovered,
                            "files_total": p["progress"].files_total, "files_completed": p["progress"].files_completed,
                            "bytes_total": p["progress"].bytes_total,
                            "bytes_completed": min(p["progress"].bytes_completed, p["progress"].bytes_total),
                            "files_watched": p["progress"].files_total,
                            "files_active": p["progress"].files_total - p["progress"].files_completed,
                            "errors": p["progress"].errors,
                            "queue_depth": p["progress"].files_total - p["progress"].files_completed})
        return {"instance": self.instance, "started_at": self.started_at,
                "interval_ms": _clamp(int(self.interval * 1000), HEARTBEAT_MS_MIN, HEARTBEAT_MS_MAX),
                "sources": sources[:H.HEARTBEAT_SOURCES_MAX], "final": final}

    async def heartbeat(self, force: bool = False) -> None:
        now = time.monotonic()
        if not force and now - self.last_heartbeat < self.interval:
            return
        self.last_heartbeat = now
        try:
            await self.call("ingest_heartbeat", self._heartbeat_args())
        except DaemonError as exc:
            log.warning("heartbeat refused: %s", exc)

    async def last_heartbeat_sent(self) -> None:
        """Tell the daemon this ingester is stopping (so its silence is not taken for a crash): one
        attempt, briefly, since the daemon may be the reason it stops."""
        if not self.sources:
            return
        try:
            await asyncio.wait_for(self.request("ingest_heartbeat", self._heartbeat_args(final=True)), 2.0)
        except (asyncio.TimeoutError, Exception):
            log.debug("the final heartbeat did not reach the daemon", exc_info=True)

    # ------------------------------------------------------------------ discovery
    def default_locations(self, harness: str) -> list[str]:
        """The directories a harness keeps its transcripts in (for telling a user none were found)."""
        home, env = self.home, self.env
        if harness == claude.HARNESS:
            dirs = [os.path.join(env["CLAUDE_CONFIG_DIR"], "projects")] if env.get("CLAUDE_CONFIG_DIR") else []
            return dirs + [os.path.join(home, ".claude", "projects"), os.path.join(home, ".config", "claude", "projects")]
        if harness == codex.HARNESS:
            return [os.path.join(env.get("CODEX_HOME") or os.path.join(home, ".codex"), "sessions")]
        dirs = [os.path.join(env["GEMINI_CLI_HOME"], ".gemini", "tmp")] if env.get("GEMINI_CLI_HOME") else []
        return dirs + [os.path.join(home, ".gemini", "tmp")]

    def discover(self, harness: str) -> list[str]:
        mod = MODULES[harness]
        if not self.paths:
            return _one_name_per_file(mod.discover(self.env, self.home))
        out: list[str] = []
        for p in self.paths:
            if os.path.isdir(p):
                out.extend(_walk(p, FILE_PATTERNS[harness]))
            elif _regular(p):
                out.append(os.path.abspath(p))
        return _one_name_per_file(out)

    # ------------------------------------------------------------------ one pass over everything
    async def run_once(self, totals: Totals) -> None:
        self.sender = _Sender(self, totals)
        try:
            await self._pass(totals)
        finally:
            if self.sender.inflight is not None:  # stopped, or failed: the unacknowledged batch is read again
                self.sender.inflight.cancel()

    async def _pass(self, totals: Totals) -> None:
        self.failed = set()
        plan: list[tuple[str, str, str]] = []
        self.sources = {}
        for harness in self.harnesses:
            for path in self.discover(harness):
                source = MODULES[harness].new_info(path).source
                plan.append((harness, source, path))
                entry = self.sources.setdefault(source, {"harness": harness, "progress": _Progress()})
                entry["progress"].files_total += 1
        self.discovered = True
        sizes = {path: _size(path) for _h, _s, path in plan}
        self._recount(plan)
        await self.heartbeat(force=True)
        for harness, source, path in plan:
            if self.stop.is_set():
                break
            before = self._done_bytes(source, path, sizes[path])
            try:
                if harness in DOCUMENT_HARNESSES:
                    await self._document(harness, path, totals)
                else:
                    await self._jsonl(harness, path, totals)
            except reader.NotRegular:
                continue
            except OSError as exc:
                totals.unreadable += 1
                self.failed.add(path)
                totals.malformed_at.append(f"{path}: unreadable ({exc.strerror or exc})")
                continue
            except (Stopped, asyncio.CancelledError):
                raise
            except Exception as exc:  # one bad file must not stop every other one, now and at each restart
                log.error("skipping %s this pass: %s: %s", path, type(exc).__name__, exc)
                totals.unreadable += 1
                self.failed.add(path)
                totals.malformed_at.append(f"{path}: not ingested ({type(exc).__name__})")
                continue
            self._progressed(source, path, sizes, before)
            await self.heartbeat()
        try:
            await self.sender.send()
            await self.sender.drain()
        except (Stopped, asyncio.CancelledError):
            raise
        except Exception as exc:
            log.error("the last batch of this pass was refused: %s: %s", type(exc).__name__, exc)
            totals.malformed_at.append(f"a batch was refused ({type(exc).__name__}); its files are read again")
        self._recount(plan)
        await self.heartbeat(force=True)

    def _progressed(self, source: str, path: str, sizes: dict[str, int], before: int) -> None:
        size = _size(path)
        after = self._done_bytes(source, path, size)
        p = self.sources[source]["progress"]
        p.bytes_total += size - sizes[path]
        sizes[path] = size
        p.bytes_completed += after - before
        if before < size <= after:
            p.files_completed += 1

    def _recount(self, plan: list[tuple[str, str, str]]) -> None:
        """Progress from the acknowledged checkpoints, after the pass's last batch came back. A file that
        could not be read is not backlog (nothing will change until it does): it counts as done and as
        an error, which is what health and coverage then report."""
        for entry in self.sources.values():
            p = entry["progress"]
            p.files_completed = p.bytes_completed = p.bytes_total = p.errors = 0
        for _h, source, path in plan:
            p = self.sources[source]["progress"]
            size = _size(path)
            done = size if path in self.failed else self._done_bytes(source, path, size)
            p.bytes_total += size
            p.bytes_completed += min(done, size)
            if done >= size:
                p.files_completed += 1
            if path in self.failed:
                p.errors += 1

    def _done_bytes(self, source: str, path: str, size: int) -> int:
        cp = self.checkpoints.get((source, checkpoint_key(path)))
        if not cp:
            return 0
        done = cp.get("bytes", 0) if isinstance(cp.get("bytes"), int) else 0
        if done < size:
            try:
                quiet = time.time() - os.stat(path).st_mtime > QUIET_TAIL_S
            except OSError:
                quiet = False
            if quiet and cp.get("tail_only"):
                return size  # only an unfinished line is left, and nobody is writing it
        return done

    async def run(self, watch: bool, totals: Totals) -> None:
        try:
            await self._run(watch, totals)
        except Stopped:
            log.info("stopped while waiting for the daemon; the unacknowledged batch is sent again next time")
        finally:
            await self.last_heartbeat_sent()

    async def _run(self, watch: bool, totals: Totals) -> None:
        await self.load_checkpoints()
        while True:
            before = (totals.events, totals.imported, totals.malformed)
            await self.run_once(totals)
            if (totals.events, totals.imported, totals.malformed) != before:
                log.info("pass done: %d events read (%d new), %d malformed records so far; %d secrets redacted",
                         totals.events, totals.imported, totals.malformed, totals.redacted)
            if not watch or self.stop.is_set():
                return
            try:
                await asyncio.wait_for(self.stop.wait(), self.interval)
                return
            except asyncio.TimeoutError:
                pass

    # ------------------------------------------------------------------ events as messages
    def project(self, cwd: str | None) -> workspace.Project:
        p = self.projects.get(cwd)
        if p is None:
            p = self.projects[cwd] = workspace.project_of(cwd)
        return p

    @staticmethod
    def session_id(harness: str, native: str) -> str:
        return clip_utf8(f"{harness}:{native}", L.SESSION_ID_MAX_BYTES)

    def to_message(self, harness: str, info: SessionInfo, ev: Event, ts: int) -> tuple[dict[str, Any] | None, int]:
        """(the import_messages message of one event, secrets redacted from it); None for an event
        with nothing to store."""
        text, found = redact(ev.text) if ev.text else (ev.text, {})
        n_redacted = sum(found.values())
        if not text or not text.strip():
            if ev.type == H.TOOL_RESPONSE:
                text = EMPTY_OUTPUT
            elif ev.type == H.TOOL_CALL:
                text = "{}"
            else:
                return None, n_redacted
        sid = self.session_id(harness, ev.session or info.session_id)
        tags = [harness]
        if info.cwd:
            tags.append(clip_utf8(f"project:{os.path.basename(info.cwd.rstrip('/')) or info.cwd}", L.TAG_MAX_BYTES))
        metadata: dict[str, Any] = {"tags": tags, "memory_kind": "episode", "memory_tier": "short",
                                    "importance": L.IMPORTANCE_DEFAULT, "relations": [], "source_message_ids": []}
        if ev.call_id:
            metadata["tool_call_id"] = clip_utf8(ev.call_id, L.TOOL_CALL_ID_MAX_BYTES)
        event: dict[str, Any] = {"type": ev.type}
        if ev.tool_name:
            event["tool_name"] = clip_utf8(ev.tool_name, H.TOOL_NAME_MAX_BYTES)
        if ev.is_error is not None:
            event["is_error"] = bool(ev.is_error)
        if isinstance(ev.exit_code, int) and -2**31 <= ev.exit_code < 2**31:
            event["exit_code"] = ev.exit_code
        if ev.model:
            event["model"] = clip_utf8(ev.model, H.MODEL_MAX_BYTES)
        if ev.files:
            event["files"] = self.resolve_files(info, ev)
        return {
            "message_id": derived_ulid(ts, f"{harness}:{ev.session or info.session_id}:{ev.key}"),
            "session_id": sid,
            "timestamp": ts,
            "role": H.EVENT_ROLE[ev.type],
            "content": clip_utf8(text, L.CONTENT_MAX_BYTES, CUT_MARK),
            "revision": 1,
            "updated_at": ts,
            "metadata": metadata,
            "event": event,
        }, n_redacted

    def resolve_files(self, info: SessionInfo, ev: Event) -> list[dict[str, Any]]:
        session = self.project(info.cwd)
        out = []
        for touch in ev.files[:H.FILES_PER_EVENT_MAX]:
            if not touch.path or len(touch.path.encode("utf-8", "replace")) > H.PATH_MAX_BYTES:
                continue
            r = workspace.resolve(touch.path, info.cwd, session)
            if len(r.path.encode("utf-8", "replace")) > H.PATH_MAX_BYTES:
                continue
            out.append({"path": clip_utf8(r.path, H.PATH_MAX_BYTES), "root": _utf8(r.root), "tail": _utf8(r.tail),
                        "project": _utf8(r.project), "op": touch.op})
        return out

    def session_updates(self, harness: str, info: SessionInfo, sids: list[str]) -> list[dict[str, Any]]:
        """Session records whose metadata changed since they were last sent (redacted, clipped)."""
        out = []
        for native in dict.fromkeys([info.session_id, *sids]):
            sid = native if native.startswith(harness + ":") else self.session_id(harness, native)
            meta = self.session_meta(harness, info, sid)
            if meta != self.sent_meta.get(sid):
                out.append(meta)
        return out

    def session_meta(self, harness: str, info: SessionInfo, sid: str) -> dict[str, Any]:
        main = sid == self.session_id(harness, info.session_id)
        project = self.project(info.cwd)
        meta: dict[str, Any] = {"session_id": sid, "harness": harness, "source": info.source}
        if not main:  # a session sharing this file (a Claude subagent in an old-layout file)
            meta["source"] = H.SOURCE_CLAUDE_SUBAGENTS if harness == claude.HARNESS else info.source
            meta["parent_session_id"] = self.session_id(harness, info.session_id)
        fields = {"title": (info.title, H.TITLE_MAX_BYTES), "cwd": (info.cwd, H.META_TEXT_MAX_BYTES),
                  "root": (project.root, H.META_TEXT_MAX_BYTES), "project": (project.identity, H.META_TEXT_MAX_BYTES),
                  "branch": (info.branch, H.META_TEXT_MAX_BYTES), "slug": (info.slug, H.META_TEXT_MAX_BYTES),
                  "summary": (info.summary, H.META_TEXT_MAX_BYTES),
                  "first_prompt": (info.first_prompt, H.META_TEXT_MAX_BYTES), "model": (info.model, H.MODEL_MAX_BYTES)}
        for name, (value, limit) in fields.items():
            if value:
                if name in ("title", "summary", "first_prompt", "slug"):
                    value = redact(value)[0]
                meta[name] = clip_utf8(value, limit)
        if info.mode in H.MODES:
            meta["mode"] = info.mode
        if main and info.parent_session_id:
            meta["parent_session_id"] = self.session_id(harness, info.parent_session_id)
        return meta

    # ------------------------------------------------------------------ JSON Lines files
    async def _jsonl(self, harness: str, path: str, totals: Totals) -> None:
        mod = MODULES[harness]
        fd, st = reader.open_regular(path)
        try:
            info = mod.new_info(path)
            key = (info.source, checkpoint_key(path))
            cp = self.checkpoints.get(key)
            offset = reader.resume_offset(cp, fd, st)
            counts = {"events": 0, "redacted": 0, "malformed": 0, "lines": 0}
            if offset and cp:
                _restore(info, cp.get("info"))
                counts = {k: cp.get(k, 0) if isinstance(cp.get(k), int) else 0 for k in counts}
            if offset == st.st_size and cp:
                return
            totals.files += 1
            batch = _Batch(self, harness, info, path, totals)
            bad_lines: list[int] = []
            end = offset
            last_ts = cp.get("last_ts") if offset and cp and isinstance(cp.get("last_ts"), int) else None
            for line in reader.read_lines(fd, offset, st.st_size):
                counts["lines"] += 1
                end = line.end
                if line.obj is None and not line.malformed:
                    continue  # a blank line
                totals.lines += 1
                events: list[Event] = []
                if line.malformed:
                    counts["malformed"] += 1
                    bad_lines.append(counts["lines"])
                else:
                    try:
                        events = mod.parse_line(line.obj, info, line.offset)
                    except (Malformed, ValueError, TypeError, KeyError, AttributeError, RecursionError):
                        counts["malformed"] += 1
                        bad_lines.append(counts["lines"])
                for ev in events:
                    last_ts = batch.add(ev, last_ts)
                counts["events"] += len(events)
                if batch.full():
                    counts["redacted"] += batch.redacted
                    counts["malformed"] += batch.dropped
                    await batch.flush(self._jsonl_cp(fd, st, end, info, counts, last_ts, path))
                    if self.stop.is_set():
                        return
            counts["redacted"] += batch.redacted
            counts["malformed"] += batch.dropped
            if end != offset or batch.messages or not cp:
                await batch.flush(self._jsonl_cp(fd, st, end, info, counts, last_ts, path))
            totals.malformed += len(bad_lines)
            if bad_lines:
                totals.malformed_at.append(f"{path}: lines {bad_lines[:50]}")
        finally:
            os.close(fd)

    def _jsonl_cp(self, fd: int, st: os.stat_result, end: int, info: SessionInfo, counts: dict[str, int],
                  last_ts: int | None, path: str) -> dict[str, Any]:
        return reader.jsonl_checkpoint(fd, st, end, info=_stash(info), last_ts=last_ts, at=_now_ms(),
                                       tail_only=end < st.st_size, harness=info.harness, **counts)

    # ------------------------------------------------------------------ whole JSON documents
    async def _document(self, harness: str, path: str, totals: Totals) -> None:
        mod = MODULES[harness]
        fd, st = reader.open_regular(path)
        try:
            info = mod.new_info(path)
            key = (info.source, checkpoint_key(path))
            cp = self.checkpoints.get(key)
            if reader.document_unchanged(cp, st):
                return
            if self.doc_failures.get(path) == (st.st_size, st.st_mtime_ns):
                return  # still the same unparseable bytes
            data, digest = reader.document_state(fd, st)
        finally:
            os.close(fd)
        totals.files += 1
        base = {"file": [st.st_dev, st.st_ino], "size": st.st_size, "mtime_ns": st.st_mtime_ns, "bytes": st.st_size,
                "harness": info.harness,
                "at": _now_ms()}
        if data is None:
            totals.malformed += 1
            totals.malformed_at.append(f"{path}: larger than {reader.DOCUMENT_CAP} bytes, skipped")
            self.sender.stage([], {"source": info.source, "key": key[1], "value": {**base, "malformed": 1}})
            return
        if cp and cp.get("digest") == digest:
            self.sender.stage([], {"source": info.source, "key": key[1], "value": {**cp, **base}})
            return
        try:
            events = mod.parse_document(json.loads(data), info)
        except (ValueError, RecursionError, Malformed, TypeError, KeyError, AttributeError):
            # maybe caught mid-rewrite: read again when the file changes (its size or time), counted once
            # per version; meanwhile it is done, not backlog (its checkpoint says so, and why)
            self.doc_failures[path] = (st.st_size, st.st_mtime_ns)
            totals.malformed += 1
            totals.malformed_at.append(f"{path}: not a readable session document")
            self.sender.stage([], {"source": info.source, "key": key[1], "value": {**base, "malformed": 1}})
            return
        self.doc_failures.pop(path, None)
        totals.lines += 1
        batch = _Batch(self, harness, info, path, totals)
        last_ts = None
        for ev in events:
            last_ts = batch.add(ev, last_ts)
            if batch.full():
                await batch.flush(None)
        await batch.flush({**base, "digest": digest, "events": len(events), "redacted": batch.redacted_total,
                           "info": _stash(info)})
        if self.sender.full():
            await self.sender.send()


class _Sender:
    """One import_messages call's worth of everything a pass produces — events, session metadata and
    the checkpoints of the files (or parts of files) they complete — sent when full or at the end of a
    pass, with at most one batch in flight while the next one is parsed. Each batch is one durable
    append in the daemon, so whatever a checkpoint in it covers is in it too; what is acknowledged is
    recorded locally only when the reply came."""

    def __init__(self, ingester: Ingester, totals: Totals) -> None:
        self.ing = ingester
        self.totals = totals
        self.inflight: asyncio.Task | None = None
        self._reset()

    def _reset(self) -> None:
        self.messages: list[dict[str, Any]] = []
        self.sessions: dict[str, dict[str, Any]] = {}
        self.checkpoints: list[dict[str, Any]] = []
        self.bytes = 0

    def full(self) -> bool:
        return (len(self.messages) >= L.IMPORT_BATCH_PREFERRED or self.bytes >= L.IMPORT_BATCH_PREFERRED_BYTES
                or len(self.checkpoints) >= H.CHECKPOINTS_PER_BATCH_MAX
                or len(self.sessions) >= H.SESSIONS_PER_BATCH_MAX)

    def add(self, msg: dict[str, Any]) -> None:
        self.messages.append(msg)
        self.bytes += len(msgpack.packb(msg, use_bin_type=True)) + 16

    def stage(self, sessions: list[dict[str, Any]], checkpoint: dict[str, Any] | None) -> None:
        for meta in sessions:
            self.sessions[meta["session_id"]] = meta
            self.bytes += len(msgpack.packb(meta, use_bin_type=True)) + 16
        if checkpoint is not None:
            self.checkpoints.append(checkpoint)
            self.bytes += H.CHECKPOINT_VALUE_MAX_BYTES // 4

    async def send(self) -> None:
        """Wait for the batch in flight (its failure surfaces here), then put this one in flight."""
        await self.drain()
        if not (self.messages or self.sessions or self.checkpoints):
            return
        args = {"messages": self.messages, "sessions": list(self.sessions.values()), "checkpoints": self.checkpoints}
        self._reset()
        self.inflight = asyncio.ensure_future(self._send(args))

    async def drain(self) -> None:
        task, self.inflight = self.inflight, None
        if task is not None:
            await task

    async def _send(self, args: dict[str, Any]) -> None:
        ing = self.ing
        reply = await ing.call("import_messages", args)
        self.totals.imported += reply.get("imported", 0)
        self.totals.existing += reply.get("existing", 0)
        self.totals.events += len(args["messages"])
        if ing.progress is not None and args["messages"]:
            ing.progress(len(args["messages"]))
        for meta in args["sessions"]:
            ing.sent_meta[meta["session_id"]] = meta
        for cp in args["checkpoints"]:
            ing.checkpoints[(cp["source"], cp["key"])] = cp["value"]
        await ing.heartbeat()  # a long backfill must not make the ingester look dead (at most every interval)


class _Batch:
    """One file's events on their way into the pass's sender, with the file's own counters."""

    def __init__(self, ingester: Ingester, harness: str, info: SessionInfo, path: str, totals: Totals) -> None:
        self.ing = ingester
        self.sender = ingester.sender
        self.harness = harness
        self.info = info
        self.path = path
        self.key = checkpoint_key(path)
        self.totals = totals
        self.sids: dict[str, None] = {}   # sessions of the events added since the last flush
        self.pending = 0                  # events added since the last flush
        self.redacted = 0                 # since the last flush
        self.dropped = 0                  # events without a usable time (counted as malformed), likewise
        self.redacted_total = 0

    def full(self) -> bool:
        return self.sender.full()

    def add(self, ev: Event, last_ts: int | None) -> int | None:
        """Queue one event; returns the time to give the next event whose own time is unusable."""
        ts = ev.ts_ms
        if not 0 <= ts <= _now_ms() + FUTURE_SLACK_MS:
            if last_ts is None:
                self.totals.malformed += 1
                self.dropped += 1
                return last_ts
            ts = last_ts  # from the far future (or before 1970): the previous event's time, deterministically
        msg, n_redacted = self.ing.to_message(self.harness, self.info, ev, ts)
        self.redacted += n_redacted
        self.redacted_total += n_redacted
        self.totals.redacted += n_redacted
        if msg is not None:
            self.sender.add(msg)
            self.sids[msg["session_id"]] = None
            self.pending += 1
        return ts

    async def flush(self, checkpoint: dict[str, Any] | None) -> None:
        """Hand what this file produced so far (and the checkpoint it reaches) to the sender, which
        sends when it is full."""
        sessions = self.ing.session_updates(self.harness, self.info, list(self.sids))
        if self.pending or sessions or checkpoint is not None:
            self.sender.stage(sessions, {"source": self.info.source, "key": self.key, "value": checkpoint}
                              if checkpoint is not None else None)
        self.sids, self.pending, self.redacted, self.dropped = {}, 0, 0, 0
        if self.sender.full():
            await self.sender.send()


def _restore(info: SessionInfo, stash: Any) -> None:
    if not isinstance(stash, dict):
        return
    for k, v in stash.items():
        if k == "calls" and isinstance(v, dict):
            info.calls.update({str(a): str(b) for a, b in v.items()})
        elif hasattr(info, k) and (v is None or isinstance(v, str)):
            setattr(info, k, v)


# What a checkpoint keeps of a session's facts: redacted like the session record (a checkpoint is in
# the log too) and clipped, so that the whole checkpoint stays within CHECKPOINT_VALUE_MAX_BYTES.
_STASH_REDACTED = ("title", "summary", "first_prompt", "slug")
_STASH_KEPT = ("session_id", "parent_session_id", "harness", "source")   # identities: never cut
_STASH_LIMITS = {"title": H.TITLE_MAX_BYTES, "model": H.MODEL_MAX_BYTES}
STASH_MAX_BYTES = H.CHECKPOINT_VALUE_MAX_BYTES - 2 * L.KiB   # the rest of a checkpoint is a few hundred bytes


def _stash(info: SessionInfo) -> dict[str, Any]:
    d: dict[str, Any] = {}
    for k, v in asdict(info).items():
        if k == "calls" or v is None:
            continue
        if isinstance(v, str) and k not in _STASH_KEPT:
            if k in _STASH_REDACTED:
                v = redact(v)[0]
            v = clip_utf8(v, _STASH_LIMITS.get(k, H.META_TEXT_MAX_BYTES))
        d[k] = _utf8(v) if isinstance(v, str) else v
    calls = [(clip_utf8(a, L.TOOL_CALL_ID_MAX_BYTES), clip_utf8(b, H.TOOL_NAME_MAX_BYTES))
             for a, b in list(info.calls.items())[-CALLS_KEPT:]]
    d["calls"] = dict(calls)
    while len(msgpack.packb(d, use_bin_type=True)) > STASH_MAX_BYTES:
        if calls:   # the oldest pending calls go first (a result far from its call loses its tool name)
            calls = calls[len(calls) // 2 + 1:]
            d["calls"] = dict(calls)
            continue
        longest = max((k for k, v in d.items() if isinstance(v, str) and k not in _STASH_KEPT),
                      key=lambda k: len(d[k]), default=None)
        if longest is None or not d[longest]:
            break
        d[longest] = clip_utf8(d[longest], len(d[longest].encode("utf-8", "replace")) // 2)
    return d


def _clamp(value: int, lo: int, hi: int) -> int:
    return min(max(lo, value), hi)


def _now_ms() -> int:
    return time.time_ns() // 1_000_000


def _size(path: str) -> int:
    try:
        st = os.stat(path)
        return st.st_size if stat.S_ISREG(st.st_mode) else 0
    except OSError:
        return 0


def _regular(path: str) -> bool:
    try:
        return stat.S_ISREG(os.stat(path).st_mode)
    except OSError:
        return False


def _one_name_per_file(paths: list[str]) -> list[str]:
    """``paths`` sorted, each file once: a symlinked project directory (or a hard link) shows one
    transcript under several names, and reading it under each would count it (its bytes, events,
    checkpoint) once per name. The name without symlinks wins, else the first in order."""
    names: dict[tuple[int, int], list[str]] = {}
    for p in dict.fromkeys(paths):
        try:
            st = os.stat(p)
        except OSError:
            continue  # gone since discovery
        names.setdefault((st.st_dev, st.st_ino), []).append(p)
    return sorted(n[0] if len(n) == 1 else min(n, key=lambda p: (os.path.realpath(p) != p, p)) for n in names.values())


def _walk(top: str, pattern: str) -> list[str]:
    """Regular files matching ``pattern`` under ``top``; symlinked directories are not followed (no
    loops), symlinked files only when they resolve to regular files."""
    out = []
    for dirpath, _dirs, _files in os.walk(top, followlinks=False):
        for p in glob.glob(os.path.join(glob.escape(dirpath), pattern)):
            if _regular(p):
                out.append(os.path.abspath(p))
    return out
