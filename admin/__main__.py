"""``convmem export | import | import-transcripts | health | rebuild``.

Exit codes: 0 done, 1 the daemon refused or could not be reached, 2 bad command line or input file.
Long work shows count, rate and ETA on a terminal (stderr) and stays quiet otherwise; the final
summary goes to stdout.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import signal
import sys
from typing import Any, BinaryIO, TextIO

from mcpfront.client import (DEFAULT_TIMEOUT_S, DaemonClient, identity_data_dir, read_curve_client_keys,
                             read_curve_server_key)
from mcpfront.server import Backend
from mcpfront.spawn import Spawner
from protocol import errors as E
from protocol import limits as L
from protocol import wire
from protocol.config import default_data_dir, default_endpoint

from ingest.service import HARNESSES, DaemonError, Ingester, Totals

from .progress import Progress

PAGE = 1000
BATCH_ENVELOPE_BYTES = 64 * 1024  # op, request id, the args map, msgpack headers: far less than this


class Failed(Exception):
    """The daemon answered an error; the message is its error, shown to the user as is."""


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="convmem", description="convmem administration")
    p.add_argument("--data-dir", help="data directory (default: $CONVMEM_DATA_DIR, else $XDG_DATA_HOME/convmem)")
    p.add_argument("--endpoint", help="daemon endpoint (default: $CONVMEM_ENDPOINT, else ipc:// in DATA_DIR/run)")
    p.add_argument("--no-spawn", action="store_true", help="never start a storage daemon")
    p.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT_S, help="seconds per daemon request attempt")
    p.add_argument("--curve-server-key-file", help="the daemon's CURVE public key, for a tcp:// endpoint")
    p.add_argument("--curve-client-key-file", help="this client's CURVE key pair, a secret certificate whose "
                                                   "public key is on the daemon's allow-list "
                                                   "(default: $CONVMEM_CURVE_CLIENT_KEY_FILE)")
    sub = p.add_subparsers(dest="command", required=True)
    e = sub.add_parser("export", help="write the store (or one session) as JSON Lines, one message per line")
    e.add_argument("--session", help="only this session_id")
    e.add_argument("-o", "--output", default="-", help="file to write (default: stdout)")
    i = sub.add_parser("import", help="import JSON Lines written by export (idempotent)")
    i.add_argument("file", help="file to read ('-' for stdin)")
    t = sub.add_parser("import-transcripts", help="import agent session transcripts (only what is new)")
    t.add_argument("harness", choices=HARNESSES)
    t.add_argument("paths", nargs="*", help="files or directories (default: the harness's own location)")
    t.add_argument("--watch", action="store_true", help="keep importing new lines until interrupted")
    t.add_argument("--interval", type=float, default=5.0, help="seconds between --watch scans")
    h = sub.add_parser("health", help="a readable summary of get_system_health")
    h.add_argument("--json", action="store_true", help="the raw JSON instead")
    sub.add_parser("rebuild", help="compact the log and rebuild the indexes (rebuild_index)")
    # argparse gives 'paths' its (empty) share as soon as it meets the harness, so paths written after
    # an option ("codex --watch DIR") come back unrecognised: they are paths all the same.
    args, extra = p.parse_known_args(argv)
    if extra:
        if args.command != "import-transcripts" or any(x.startswith("-") for x in extra):
            p.error(f"unrecognized arguments: {' '.join(extra)}")
        args.paths = [*args.paths, *extra]
    return args


class Admin:
    def __init__(self, args: argparse.Namespace) -> None:
        data_dir = os.path.abspath(args.data_dir or default_data_dir())
        endpoint = args.endpoint or default_endpoint(data_dir)
        self.client = DaemonClient(endpoint, timeout=args.timeout,
                                   curve_server_key=read_curve_server_key(args.curve_server_key_file),
                                   curve_client_keys=read_curve_client_keys(args.curve_client_key_file),
                                   expected_data_dir=identity_data_dir(args.data_dir, endpoint, data_dir))
        spawner = None if args.no_spawn else Spawner(self.client, data_dir, endpoint)
        self.backend = Backend(self.client, spawner)

    async def call(self, op: str, args: dict[str, Any]) -> dict[str, Any]:
        # the tools go through the front-end's backend (rebuild polling...); admin ops straight to the daemon
        reply = await self.backend.call(op, args) if op in wire.TOOLS else await self._direct(op, args)
        if reply.get("status") == "ERROR":
            err = reply.get("error") or {}
            raise Failed(f"{op}: {err.get('code')}: {err.get('message')}")
        return reply

    async def _direct(self, op: str, args: dict[str, Any]) -> dict[str, Any]:
        if self.backend.spawner is not None:
            await self.backend.spawner.ensure()
        while True:
            reply = await self.client.request(op, args)
            err = reply.get("error") if reply.get("status") == "ERROR" else None
            if err and err.get("code") == "BUSY" and "unavailable" not in str(err.get("message")):
                await asyncio.sleep(err.get("retry_after_ms", 250) / 1000)  # a rebuild: wait it out
                continue
            return reply

    # -- export -----------------------------------------------------------------------------------
    async def export(self, out: TextIO, session: str | None) -> int:
        """Every message in the store's creation order with every field — the event facts of agent
        history included — and, just before a session's first message, a ``{"session": {...}}`` line
        with its metadata. An import of the file recreates the store, creation order and all."""
        total = None if session else (await self.call("get_system_health", {}))["active_messages"]
        progress = Progress("exported", total)
        after = 0
        while True:
            args: dict[str, Any] = {"after_seq": after, "limit": PAGE}
            if session is not None:
                args["session_id"] = session
            page = await self.call("export_messages", args)
            metas = {m["session_id"]: m for m in page["sessions"]}
            for msg in page["messages"]:
                meta = metas.pop(msg["session_id"], None)
                if meta is not None:
                    out.write(json.dumps({"session": meta}, ensure_ascii=False) + "\n")
                out.write(json.dumps(msg, ensure_ascii=False) + "\n")
                progress.advance()
            if page["next_after"] is None:
                break
            after = page["next_after"]
        out.flush()
        progress.done()
        return progress.count

    # -- import -----------------------------------------------------------------------------------
    async def import_messages(self, messages, progress: Progress) -> tuple[int, int]:
        """Send in batches bounded by count and encoded bytes (each batch: one durable append, one
        fsync). ``messages`` yields message objects, or (where, message) pairs: ``where`` (e.g.
        "line 12") then replaces the batch position in a VALIDATION_ERROR."""
        imported = existing = future = 0  # future: messages whose times lie beyond the clock's bound
        batch: list[dict[str, Any]] = []
        sessions: list[dict[str, Any]] = []
        origins: dict[str, list[str | None]] = {"messages": [], "sessions": []}
        size = 0
        budget = L.MAX_REQUEST_BYTES - BATCH_ENVELOPE_BYTES

        async def flush() -> None:
            nonlocal imported, existing, future, batch, sessions, origins, size
            if batch or sessions:
                try:
                    r = await self.call("import_messages", {"messages": batch, "sessions": sessions})
                except Failed as exc:
                    raise Failed(_name_origin(str(exc), origins)) from None
                imported += r["imported"]
                existing += r["existing"]
                future += r.get("future_times", 0)
                progress.advance(len(batch))
                batch, sessions, size = [], [], 0
                origins = {"messages": [], "sessions": []}

        for item in messages:
            where, msg = item if isinstance(item, tuple) else (None, item)
            # {"session": {...}}: a session's metadata, written by export before its first message
            meta = msg.get("session") if isinstance(msg, dict) and set(msg) == {"session"} else None
            try:
                n = len(wire.encode(msg)) + 16
            except Exception:  # nothing the daemon could read
                raise Failed(f"import_messages: {E.VALIDATION_ERROR}: {where or 'a message'}: cannot be encoded "
                             "(lone surrogates, integers beyond 64 bits or too deep nesting)") from None
            if (batch or sessions) and (len(batch) >= L.IMPORT_BATCH_MAX or len(sessions) >= L.IMPORT_BATCH_MAX
                                        or size + n > budget):
                await flush()
            if meta is not None:
                sessions.append(meta)
                origins["sessions"].append(where)
            else:
                batch.append(msg)
                origins["messages"].append(where)
            size += n
        await flush()
        self.future_times = future
        return imported, existing

    async def import_file(self, stream: BinaryIO) -> dict[str, Any]:
        bad: list[int] = []

        def messages():
            for lineno, line in enumerate(stream, 1):
                if not line.strip():
                    continue
                try:
                    obj = json.loads(line.decode("utf-8"))
                except (ValueError, RecursionError):  # not UTF-8, not JSON (UnicodeDecodeError is a ValueError)
                    bad.append(lineno)
                    continue
                yield f"line {lineno}", obj
        progress = Progress("imported")
        imported, existing = await self.import_messages(messages(), progress)
        progress.done()
        result = {"imported": imported, "existing": existing, "malformed_lines": len(bad), "first_malformed": bad[:10]}
        if self.future_times:
            result["future_times"] = self.future_times
        return result

    async def import_transcripts(self, harness: str, paths: list[str], watch: bool,
                                 interval: float) -> dict[str, Any]:
        """The ingester (``convmem-ingest``) for one harness, once or following the files; its
        checkpoints live in the store, so a re-run reads only what is new."""
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            try:
                loop.add_signal_handler(sig, stop.set)
            except (NotImplementedError, RuntimeError):
                pass
        progress = Progress(f"{harness} events")

        async def request(op: str, args: dict[str, Any]) -> dict[str, Any]:
            if self.backend.spawner is not None:
                await self.backend.spawner.ensure()
            return await self.client.request(op, args)

        ingester = Ingester(request, (harness,), paths=[os.path.abspath(p) for p in paths] or None,
                            interval=interval, progress=progress.advance, stop=stop)
        totals = Totals()
        if not paths:
            missing = [d for d in ingester.default_locations(harness) if not os.path.isdir(d)]
            if missing and len(missing) == len(ingester.default_locations(harness)):
                print(f"convmem: no {harness} transcripts here (looked in {', '.join(missing)})", file=sys.stderr)
        for p in paths:
            if not os.path.exists(p):
                print(f"convmem: {p}: no such file or directory (nothing imported from it)", file=sys.stderr)
        try:
            await ingester.run(watch, totals)
        except DaemonError as exc:
            raise Failed(str(exc)) from None
        finally:
            progress.done()
        return totals.report()


_BATCH_POSITION = re.compile(r"(messages|sessions)\[(\d+)\]")


def _name_origin(text: str, origins: dict[str, list[str | None]]) -> str:
    """``messages[3].role ...`` -> ``line 12: message.role ...`` when the batch's items have origins."""
    def sub(m: re.Match[str]) -> str:
        kind, i = m.group(1), int(m.group(2))
        where = origins.get(kind, [])
        return f"{where[i]}: {kind[:-1]}" if i < len(where) and where[i] else m.group(0)
    return _BATCH_POSITION.sub(sub, text)


def open_export_file(path: str) -> TextIO:
    """A new file only this user can read (0600): an export holds every message. Never an existing
    file, never through a symlink (raises FileExistsError / OSError)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    return os.fdopen(fd, "w", encoding="utf-8")


def print_health(h: dict[str, Any]) -> None:
    mb = 1024 * 1024
    mem = h["memory_estimate"]
    lines = [
        f"status           {h['status']}" + (f"  ({h['last_error']})" if h.get("last_error") else ""),
        f"messages         {h['active_messages']:,} live in {h['session_count']:,} sessions "
        f"({h['deleted_messages']:,} deleted, {h['update_records']:,} update records since the last rebuild)",
        f"log              {h['log_size'] / mb:,.1f} MiB ({h['dead_bytes'] / mb:,.1f} MiB reclaimable by rebuild), "
        f"last sequence {h['last_sequence']:,}",
        f"snapshot         {h['snapshot_size'] / mb:,.1f} MiB, valid: {h['snapshot_valid']}",
        f"memory estimate  {mem['total_bytes'] / mb:,.1f} MiB (text {mem['body_bytes'] / mb:,.1f}, "
        f"search {mem['search_index_bytes'] / mb:,.1f}, entries {mem['store_entries_bytes'] / mb:,.1f})",
        f"io since start   {h['io']['write_calls']:,} writes ({h['io']['write_bytes'] / mb:,.1f} MiB), "
        f"{h['io']['flush_calls']:,} flushes",
        f"recovery         recovered_tail={h['recovered_tail']}"
        + ("  REBUILD RUNNING" if h.get("rebuilding") else ""),
    ]
    print("\n".join(lines))


async def run(args: argparse.Namespace) -> int:
    admin = Admin(args)
    try:
        if args.command == "export":
            try:
                out = sys.stdout if args.output == "-" else open_export_file(args.output)
            except FileExistsError:
                print(f"convmem: {args.output} already exists; export never overwrites a file (remove it, or "
                      "choose another name)", file=sys.stderr)
                return 2
            except OSError as exc:
                print(f"convmem: cannot create {args.output}: {exc.strerror}", file=sys.stderr)
                return 2
            try:
                n = await admin.export(out, args.session)
            finally:
                if out is not sys.stdout:
                    out.close()
            print(json.dumps({"exported": n}), file=sys.stderr if args.output == "-" else sys.stdout)
        elif args.command == "import":
            try:
                stream = sys.stdin.buffer if args.file == "-" else open(args.file, "rb")
            except OSError as exc:
                print(f"convmem: cannot read {args.file}: {exc.strerror}", file=sys.stderr)
                return 2
            with stream:
                result = await admin.import_file(stream)
            if result.get("future_times"):
                print(f"convmem: warning: {result['future_times']} imported messages carry an id or time more than "
                      f"{L.CLOCK_SKEW_MAX_MS // 3_600_000} h in the future; they were stored as they are, and new "
                      "messages keep taking their times from the clock", file=sys.stderr)
            print(json.dumps(result))
        elif args.command == "import-transcripts":
            print(json.dumps(await admin.import_transcripts(args.harness, args.paths, args.watch, args.interval)))
        elif args.command == "health":
            h = await admin.call("get_system_health", {})
            print(json.dumps(h, indent=2)) if args.json else print_health(h)
        elif args.command == "rebuild":
            print(json.dumps(await admin.call("rebuild_index", {})))
        return 0
    except Failed as exc:
        print(f"convmem: {exc}", file=sys.stderr)
        return 1
    finally:
        admin.client.close()


def main(argv: list[str] | None = None) -> int:
    return asyncio.run(run(parse_args(argv)))


if __name__ == "__main__":
    sys.exit(main())
