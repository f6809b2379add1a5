"""``convmem export | import | import-transcripts | health | status | stop | rebuild``.

Exit codes: see EXIT_CODES (also shown by ``convmem --help``). Whatever goes wrong, the user gets one
line on stderr and a distinct exit code, never a Python traceback (CONVMEM_DEBUG=1 shows it for a bug).
Long work shows count, rate and ETA on a terminal (stderr) and stays quiet otherwise; the final
summary goes to stdout.

The admin talks to the daemon through the daemon client (``daemonclient``) like every other client —
spawn, retries, rebuild polling are its — and never imports the MCP front-end or the SDK (~1.5 s).
"""
from __future__ import annotations

import argparse
import asyncio
import errno
import json
import logging
import os
import re
import signal
import sys
import time
from typing import Any, BinaryIO, TextIO

from daemonclient.core import connect
from daemonclient.replies import NO_RETRY, RETRY_BUSY, describe
from daemonclient.transport import DEFAULT_TIMEOUT_S, read_curve_client_keys, read_curve_server_key
from protocol import errors as E
from protocol import limits as L
from protocol import wire
from protocol.config import DATA_DIR_HELP
from protocol.errors import ProtocolError
from protocol.validation import validate

from ingest.service import HARNESSES, DaemonError, Ingester, Totals

from . import status as daemon_status
from .progress import Progress, ProgressLogHandler, format_bytes, format_seconds, say

PAGE = 1000
STOP_WAIT_S = 60.0  # a clean stop writes a snapshot first: seconds on a large store
SKIPPED_SHOWN = 10  # skipped import lines named on stderr (all are counted)

# One code per kind of outcome, so scripts can tell them apart.
EXIT_OK = 0
EXIT_DAEMON = 1       # the daemon refused, could not be reached, or did not stop in time
EXIT_USAGE = 2        # bad command line, or an input file that cannot be read
EXIT_NOT_RUNNING = 3  # status / stop: no daemon runs for this data directory (as LSB's "status" says 3)
EXIT_OUTPUT = 4       # a local file could not be written (export -o into a missing directory, a full disk)
EXIT_BUG = 70         # an unexpected error: a bug (EX_SOFTWARE); CONVMEM_DEBUG=1 shows the traceback
EXIT_PIPE = 141       # stdout was closed early (``convmem export | head``), as a shell reports SIGPIPE
EXIT_INTERRUPTED = 130  # Ctrl-C (128 + SIGINT)
EXIT_CODES = f"""exit codes:
  {EXIT_OK}    done (status: the daemon is running)
  {EXIT_DAEMON}    the daemon refused, could not be reached, or did not stop in time
  {EXIT_USAGE}    bad command line, or the input file cannot be read
  {EXIT_NOT_RUNNING}    status, stop: no daemon is running for this data directory
  {EXIT_OUTPUT}    a local file could not be written (e.g. export -o into a missing directory)
  {EXIT_BUG}   unexpected internal error (set CONVMEM_DEBUG=1 to see the traceback)
  {EXIT_INTERRUPTED}  interrupted (Ctrl-C); an import can simply be run again
  {EXIT_PIPE}  the output pipe was closed early

Common options may be written before or after the command: convmem health --data-dir DIR."""


class Failed(Exception):
    """The daemon answered an error; the message is its error, shown to the user as is."""


def common_options(p: argparse.ArgumentParser, defaults: bool) -> None:
    """The options every command takes. The main parser has the defaults; each subparser repeats the
    options with SUPPRESS defaults, so a value written after the command wins only when it is given."""
    d = (lambda v: v) if defaults else (lambda v: argparse.SUPPRESS)
    p.add_argument("--data-dir", default=d(None), help=DATA_DIR_HELP)
    p.add_argument("--endpoint", default=d(None),
                   help="daemon endpoint (default: $CONVMEM_ENDPOINT, else ipc:// in DATA_DIR/run)")
    p.add_argument("--no-spawn", action="store_true", default=d(False), help="never start a storage daemon")
    p.add_argument("--timeout", type=float, default=d(DEFAULT_TIMEOUT_S), help="seconds per daemon request attempt")
    p.add_argument("--curve-server-key-file", default=d(None),
                   help="the daemon's CURVE public key, for a tcp:// endpoint")
    p.add_argument("--curve-client-key-file", default=d(None),
                   help="this client's CURVE key pair, a secret certificate whose public key is on the daemon's "
                        "allow-list (default: $CONVMEM_CURVE_CLIENT_KEY_FILE)")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="convmem", description="convmem administration", epilog=EXIT_CODES,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    common_options(p, defaults=True)
    common = argparse.ArgumentParser(add_help=False)
    common_options(common, defaults=False)
    sub = p.add_subparsers(dest="command", required=True)

    def command(name: str, **kw: Any) -> argparse.ArgumentParser:
        return sub.add_parser(name, parents=[common], **kw)
    e = command("export", help="write the store (or one session) as JSON Lines, one message per line")
    e.add_argument("--session", help="only this session_id")
    e.add_argument("-o", "--output", default="-", help="file to write (default: stdout)")
    i = command("import", help="import JSON Lines written by export (idempotent)")
    i.add_argument("file", help="file to read ('-' for stdin)")
    t = command("import-transcripts", help="import agent session transcripts (only what is new)")
    t.add_argument("harness", choices=HARNESSES)
    t.add_argument("paths", nargs="*", help="files or directories (default: the harness's own location)")
    t.add_argument("--watch", action="store_true", help="keep importing new lines until interrupted")
    t.add_argument("--interval", type=float, default=5.0, help="seconds between --watch scans")
    h = command("health", help="a readable summary of get_system_health")
    h.add_argument("--json", action="store_true", help="the raw JSON instead")
    s = command("status", help="is a daemon running for this data directory (never starts one)")
    s.add_argument("--json", action="store_true", help="one JSON object instead")
    st = command("stop", help="stop this data directory's daemon cleanly and wait until it has exited")
    st.add_argument("--wait", type=float, default=STOP_WAIT_S, metavar="SECONDS",
                    help=f"how long to wait for it to exit (default {STOP_WAIT_S:.0f})")
    command("rebuild", help="compact the log and rebuild the indexes (rebuild_index)")
    # argparse gives 'paths' its (empty) share as soon as it meets the harness, so paths written after
    # an option ("codex --watch DIR") come back unrecognised: they are paths all the same.
    args, extra = p.parse_known_args(argv)
    if extra:
        if args.command != "import-transcripts" or any(x.startswith("-") for x in extra):
            p.error(f"unrecognized arguments: {' '.join(extra)}")
        args.paths = [*args.paths, *extra]
    return args


class Admin:
    def __init__(self, args: argparse.Namespace, spawn: bool = True) -> None:
        self.daemon = connect(args.data_dir, args.endpoint, timeout=args.timeout,
                              curve_server_key=read_curve_server_key(args.curve_server_key_file),
                              curve_client_keys=read_curve_client_keys(args.curve_client_key_file),
                              spawn=spawn and not args.no_spawn)
        self.data_dir, self.endpoint = self.daemon.data_dir, self.daemon.endpoint
        self.progress: Progress | None = None  # the long work under way (what an interruption reports)
        self.invalid: list[int] = []  # import: line numbers skipped as invalid messages

    async def call(self, op: str, args: dict[str, Any]) -> dict[str, Any]:
        """The daemon's reply, or ``Failed``. A busy daemon (a rebuild running) is waited out, an absent
        one is not; rebuild itself waits for its own figures but says so when another one runs."""
        reply = await self.daemon.call(op, args, retry=NO_RETRY if op == "rebuild_index" else RETRY_BUSY)
        if reply.get("status") == "ERROR":
            raise Failed(describe(op, reply))
        return reply

    # -- export -----------------------------------------------------------------------------------
    async def export(self, out: TextIO, session: str | None) -> int:
        """Every message in the store's creation order with every field — the event facts of agent
        history included — and, just before a session's first message, a ``{"session": {...}}`` line
        with its metadata. An import of the file recreates the store, creation order and all."""
        total = None if session else (await self.call("get_system_health", {}))["active_messages"]
        progress = self.progress = Progress("exported", total)
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
        """Send in batches bounded by count and encoded bytes (the daemon stores each in durable
        slices, between other clients' requests). ``messages`` yields message objects, or (where, message) pairs: ``where`` (e.g.
        "line 12") then replaces the batch position in a VALIDATION_ERROR."""
        imported = existing = future = 0  # future: messages whose times lie beyond the clock's bound
        batch: list[dict[str, Any]] = []
        sessions: list[dict[str, Any]] = []
        origins: dict[str, list[str | None]] = {"messages": [], "sessions": []}
        size = 0
        budget = L.IMPORT_BATCH_PREFERRED_BYTES  # a message alone may be bigger: it goes in a batch of its own

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
            if where is not None and not self._acceptable(where, msg):
                continue
            # {"session": {...}}: a session's metadata, written by export before its first message
            meta = msg.get("session") if isinstance(msg, dict) and set(msg) == {"session"} else None
            try:
                n = len(wire.encode(msg)) + 16
            except Exception:  # nothing the daemon could read
                problem = "cannot be encoded (lone surrogates, integers beyond 64 bits or too deep nesting)"
                if where is None:
                    raise Failed(f"import_messages: {E.VALIDATION_ERROR}: a message: {problem}") from None
                self._skip(where, problem)
                continue
            if (batch or sessions) and (len(batch) >= L.IMPORT_BATCH_PREFERRED or len(sessions) >= L.IMPORT_BATCH_MAX
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

    def _acceptable(self, where: str, msg: Any) -> bool:
        """Check a line's object with the daemon's own validation before it joins a batch: one bad line
        would make the daemon refuse the whole batch. A bad one is counted and named on stderr (the
        field and the constraint, never its content) and skipped."""
        if isinstance(msg, dict) and set(msg) == {"session"}:
            args = {"sessions": [msg["session"]]}
        else:
            args = {"messages": [msg]}
        try:
            validate("import_messages", args)
        except ProtocolError as exc:
            self._skip(where, _name_origin(exc.message, {"messages": [where], "sessions": [where]}))
            return False
        except RecursionError:
            self._skip(where, "nested too deeply")
            return False
        return True

    def _skip(self, where: str, problem: str) -> None:
        self.invalid.append(int(where.split()[-1]) if where.startswith("line ") else 0)
        if len(self.invalid) <= SKIPPED_SHOWN:
            say(f"convmem: skipped {problem if problem.startswith(where) else f'{where}: {problem}'}")

    async def import_file(self, stream: BinaryIO) -> dict[str, Any]:
        bad: list[int] = []
        self.invalid = []
        try:
            size = os.fstat(stream.fileno()).st_size if stream.seekable() else None
        except (OSError, ValueError):
            size = None
        progress = self.progress = Progress("imported", total_bytes=size)

        def messages():
            for lineno, line in enumerate(stream, 1):
                progress.bytes_done += len(line)
                if not line.strip():
                    continue
                try:
                    obj = json.loads(line.decode("utf-8"))
                except (ValueError, RecursionError):  # not UTF-8, not JSON (UnicodeDecodeError is a ValueError)
                    bad.append(lineno)
                    continue
                yield f"line {lineno}", obj
        imported, existing = await self.import_messages(messages(), progress)
        progress.done()
        if len(self.invalid) > SKIPPED_SHOWN:
            say(f"convmem: skipped {len(self.invalid) - SKIPPED_SHOWN:,} more invalid lines")
        result = {"imported": imported, "existing": existing, "malformed_lines": len(bad),
                  "first_malformed": bad[:10], "invalid_lines": len(self.invalid),
                  "first_invalid": self.invalid[:10]}
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
        progress = self.progress = Progress(f"{harness} events")

        ingester = Ingester(self.daemon.call, (harness,), paths=[os.path.abspath(p) for p in paths] or None,
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
    b = format_bytes
    mem = h["memory_estimate"]
    lines = [
        f"status           {h['status']}" + (f"  ({h['last_error']})" if h.get("last_error") else ""),
        f"messages         {h['active_messages']:,} live in {h['session_count']:,} sessions "
        f"({h['deleted_messages']:,} deleted, {h['update_records']:,} update records since the last rebuild)",
        f"log              {b(h['log_size'])} ({b(h['dead_bytes'])} reclaimable by rebuild), "
        f"last sequence {h['last_sequence']:,}",
        f"snapshot         {b(h['snapshot_size'])}, valid: {h['snapshot_valid']}",
        f"memory estimate  {b(mem['total_bytes'])} (text {b(mem['body_bytes'])}, "
        f"search {b(mem['search_index_bytes'])}, entries {b(mem['store_entries_bytes'])})",
        f"io since start   {h['io']['write_calls']:,} writes ({b(h['io']['write_bytes'])}), "
        f"{h['io']['flush_calls']:,} flushes",
        f"recovery         recovered_tail={h['recovered_tail']}"
        + ("  REBUILD RUNNING" if h.get("rebuilding") else ""),
    ]
    print("\n".join(lines))


async def status(admin: Admin, as_json: bool) -> int:
    """Running or not from the pid file checked through /proc; the message count from the daemon when
    it answers (a short request: status never waits long, never starts a daemon)."""
    found = daemon_status.find(admin.data_dir)
    out: dict[str, Any] = {"running": found.pid is not None, "data_dir": admin.data_dir, "endpoint": admin.endpoint}
    code = EXIT_OK
    if found.pid is None:
        out["reason"] = found.why_not
        code = EXIT_NOT_RUNNING
    else:
        out["pid"] = found.pid
        if found.started_at is not None:
            out["uptime_s"] = round(max(0.0, time.time() - found.started_at), 1)
        reply = await admin.daemon.client.request("get_system_health", {}, attempts=1)
        if reply.get("status") == "OK":
            out["active_messages"] = reply["active_messages"]
            out["session_count"] = reply["session_count"]
        else:
            err = reply.get("error") or {}
            out["answer"] = f"{err.get('code')}: {err.get('message')}"
            code = EXIT_DAEMON
    if as_json:
        print(json.dumps(out))
        return code
    if found.pid is None:
        print(f"not running      ({found.why_not})")
    else:
        up = f", up {format_seconds(out['uptime_s'])}" if "uptime_s" in out else ""
        print(f"running          pid {found.pid}{up}")
    print(f"data dir         {admin.data_dir}")
    print(f"endpoint         {admin.endpoint}")
    if "active_messages" in out:
        print(f"messages         {out['active_messages']:,} live in {out['session_count']:,} sessions")
    elif "answer" in out:
        print(f"messages         unknown: the daemon did not answer ({out['answer']})")
    return code


def stop(admin: Admin, wait_s: float) -> int:
    found = daemon_status.find(admin.data_dir)
    if found.pid is None:
        print(f"convmem: no daemon is running for {admin.data_dir} ({found.why_not})", file=sys.stderr)
        return EXIT_NOT_RUNNING
    try:
        gone, waited = daemon_status.stop(found, admin.data_dir, wait_s)
    except PermissionError:
        print(f"convmem: not allowed to stop pid {found.pid}", file=sys.stderr)
        return EXIT_DAEMON
    if not gone:
        print(f"convmem: the daemon (pid {found.pid}) is still running after {wait_s:g} s; it may still be "
              "writing its snapshot (see convmem status)", file=sys.stderr)
        return EXIT_DAEMON
    print(json.dumps({"stopped": found.pid, "waited_s": round(waited, 2)}))
    return EXIT_OK


async def run(args: argparse.Namespace, held: dict[str, Any] | None = None) -> int:
    # status and stop look at the daemon that is there: they never start one
    admin = Admin(args, spawn=args.command not in ("status", "stop"))
    if held is not None:
        held["admin"] = admin
    try:
        if args.command == "export":
            try:
                out = sys.stdout if args.output == "-" else open_export_file(args.output)
            except FileExistsError:
                print(f"convmem: {args.output} already exists; export never overwrites a file (remove it, or "
                      "choose another name)", file=sys.stderr)
                return EXIT_USAGE
            except OSError as exc:
                if exc.errno == errno.ELOOP:
                    print(f"convmem: {args.output} is a symbolic link; export never writes through one",
                          file=sys.stderr)
                    return EXIT_USAGE
                print(f"convmem: cannot write {args.output}: {exc.strerror}", file=sys.stderr)
                return EXIT_OUTPUT
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
                return EXIT_USAGE
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
        elif args.command == "status":
            return await status(admin, args.json)
        elif args.command == "stop":
            return stop(admin, args.wait)  # blocking, on purpose: Ctrl-C then ends the wait at once
        elif args.command == "rebuild":
            print(json.dumps(await admin.call("rebuild_index", {})))
        return EXIT_OK
    except Failed as exc:
        _clear(admin)
        print(f"convmem: {exc}", file=sys.stderr)
        return EXIT_DAEMON
    except BrokenPipeError:
        raise  # main() ends quietly
    except OSError as exc:  # a local file: export's output file or directory, a full disk
        _clear(admin)
        if args.command == "export":
            print(f"convmem: cannot write {exc.filename or args.output}: {exc.strerror}", file=sys.stderr)
        else:
            print(f"convmem: {exc.filename or 'a local file'}: {exc.strerror}", file=sys.stderr)
        return EXIT_OUTPUT
    finally:
        admin.daemon.close()


def _clear(admin: Admin | None) -> None:
    if admin is not None and admin.progress is not None:
        admin.progress.clear()


def _interrupted(command: str, admin: Admin | None) -> str:
    """The one line a Ctrl-C leaves: what was done and what to do about it."""
    done = admin.progress.count if admin is not None and admin.progress is not None else 0
    if command == "import":
        return (f"convmem: interrupted after {done:,} messages were sent; importing the file again is "
                "safe (what is already stored is skipped)")
    if command == "export":
        return f"convmem: interrupted after {done:,} messages; the output is incomplete"
    if command == "rebuild":
        return "convmem: interrupted; the rebuild goes on in the daemon (see convmem health)"
    return "convmem: interrupted"


def _raise_interrupt(signum: int, frame: Any) -> None:
    """SIGINT raises at once, even in a blocking read (``import -`` from a pipe). Not Python's own
    default_int_handler, so asyncio.run leaves it in place instead of its own, which only cancels the
    task at its next await and so would not stop a read that blocks."""
    raise KeyboardInterrupt


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    root = logging.getLogger()
    root.addHandler(ProgressLogHandler())
    root.setLevel(logging.WARNING)
    if threading_is_main():
        signal.signal(signal.SIGINT, _raise_interrupt)
    held: dict[str, Any] = {}
    try:
        return asyncio.run(run(args, held))
    except KeyboardInterrupt:
        _clear(held.get("admin"))
        print(_interrupted(args.command, held.get("admin")), file=sys.stderr)
        return EXIT_INTERRUPTED
    except BrokenPipeError:
        # stdout's reader went away: say nothing more there (the flush at exit would fail again)
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
        return EXIT_PIPE
    except Exception as exc:  # a bug: one line, the traceback only on request
        _clear(held.get("admin"))
        if os.environ.get("CONVMEM_DEBUG"):
            import traceback

            traceback.print_exc()
        print(f"convmem: internal error ({type(exc).__name__}); please report it with CONVMEM_DEBUG=1 "
              "output", file=sys.stderr)
        return EXIT_BUG


def threading_is_main() -> bool:
    import threading

    return threading.current_thread() is threading.main_thread()


if __name__ == "__main__":
    sys.exit(main())
