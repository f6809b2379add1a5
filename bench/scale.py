"""Issue 15's scale benchmark: one command measures every goal of the issue on one generated
agent-history corpus, beside SQLite FTS5 on the same events in the same run.

    python -m bench.scale [--events 5000000] [--dir DIR] [--phases gen,ingest,start,search,wait,write,fts5]
                          [--json PATH]

Phases (each one can be run again alone; results are merged into DIR/results.json and the table is
printed from the merged results, so a re-run of one phase updates its rows only):

  gen     the corpus (``bench/scale_corpus.py``): Codex rollouts read by the real ingester into its
          import batches, reused if DIR already holds one made with the same parameters.
  ingest  a fresh data directory (DIR/data) and a real daemon on its own ipc endpoint; the batches
          sent one at a time as ``import_messages`` (the ingester's batches and sizes; its parsing is
          not timed, gen did it) -> events/s; the daemon's VmHWM (peak) and VmRSS / RssAnon after, and
          again once its work is done (the index caught up, the last snapshot installed) and it has rested.
  start   once the running daemon serves a search (its index caught up with what it replayed or
          was imported), SIGTERM (clean stop, by PID), start: seconds from spawn until ``ping`` says loaded and until
          the first ``search_messages`` answers OK; then a tail of --tail events (fresh ids) is
          imported, the idle daemon SIGKILLed and started again (the tail is replayed): same figures.
  search  the query mix (prompt words, error lines, Japanese keywords, common words, rare words): a
          warm-up pass, then one timed pass, as ``search_messages`` (limit 10) and as the history
          interface's ``search_sessions`` (n_hits 10): p50/p95/p99 per kind and overall; the memory
          after it (RssFile by kind of file: ``bench.common.mapped_rss``), then after the daemon has
          rested (it lets its mapped pages go: ``storaged.server.RELEASE_IDLE_S``), and the first
          query of each kind after that rest beside the same query warm.
  wait    a probe client on its own socket sends ``ping`` every ~5 ms while another client, in turn,
          (a) sends the heaviest search of the mix (the most common words) once — the daemon's first
          request, which maps back the pages it reads — then repeats it for 3 s, (b) runs
          ``rebuild_index`` to the end, (c) imports a burst of --burst events (fresh ids), enough to
          make the daemon fork a background snapshot, and waits for it to be installed (the daemon's
          log says when). Per part: the probe's p50/p99/max and how many pings waited > 50 ms.
  write   durable ``write_message`` through the stdio front-end (``python -m mcpfront --no-spawn``)
          with the SDK's MCP client (``bench.e2e.mcp_writes``), on this data directory with the
          N-event store loaded in the running daemon: p50/p95.
  fts5    SQLite (WAL, synchronous=FULL; ``bench.history_bench.SqliteHistory``: an events table and
          an external-content FTS5 ``porter unicode61`` index) fed the same events, one transaction
          per import batch -> events/s and size; open + first search; the same queries (words OR-ed,
          top 10 by bm25 with a snippet) warm -> p50/p95/p99; a durable one-row insert p50.

The table at the end lists each goal of the issue, our figure, FTS5's where there is one, the goal
and whether it is met. LoCoMo recall is not measured here (``python -m bench.run``).

At the end of a run the daemon is stopped cleanly (SIGTERM), so a later run of other phases starts
from its snapshot. Every process this starts is ended by PID in a ``finally`` (Ctrl-C included); sockets are ipc under
DIR; nothing is written outside DIR. The machine is shared: figures are single runs, noisy.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any, Callable, Iterator

from ulid import ULID

from bench import scale_corpus
from bench.common import pct, print_table, proc_mem
from bench.daemon import Client, Daemon, DaemonExited
from bench.e2e import mcp_writes
from bench.history_bench import SqliteHistory, fts_query
from protocol import history as H
from protocol import limits as L
from protocol import wire
from storaged.server import RELEASE_IDLE_S, SNAPSHOT_EVERY_RECORDS

PHASES = ("gen", "ingest", "start", "search", "wait", "write", "fts5")
LIMIT = 10
PACED_GAP_S = 0.05         # the paced mix: a pause after each query (an agent's between its calls)
PACED_EVERY = 4            # and every 4th query of the mix
PROBE_EVERY_S = 0.005
WAIT_GOAL_MS = 50.0
LONG_MS = 600_000          # a request's reply timeout: a rebuild or an import of a big batch may take a while


# ================================================================================ measuring


def stats_ms(seconds: list[float]) -> dict[str, Any]:
    """p50/p95/p99/max in milliseconds of some latencies in seconds."""
    ms = [x * 1000 for x in seconds]
    if not ms:
        return {"n": 0, "p50": None, "p95": None, "p99": None, "max": None}
    return {"n": len(ms), "p50": round(statistics.median(ms), 3), "p95": round(pct(ms, 95), 3),
            "p99": round(pct(ms, 99), 3), "max": round(max(ms), 3)}


def du_mib(path: str) -> float:
    p = Path(path)
    files = [p] if p.is_file() else [f for f in p.rglob("*") if f.is_file()]
    return round(sum(f.stat().st_size for f in files) / 2**20, 1)


def ok(rep: Any) -> bool:
    """A reply that is no error (search replies carry no status; errors do)."""
    return isinstance(rep, dict) and rep.get("status", "OK") not in ("ERROR", wire.REBUILDING)


def fresh_ids(batch: dict[str, Any]) -> dict[str, Any]:
    """The batch with new message ids: the extra events are written again at every run, never found
    already stored (an import of a known id is skipped, which would measure nothing)."""
    return {**batch, "messages": [{**m, "message_id": str(ULID())} for m in batch["messages"]]}


def extra_batches(d: str, skip: int, count: int) -> Iterator[dict[str, Any]]:
    """Batches of the extra corpus holding its events [skip, skip + count), with fresh ids."""
    seen = 0
    for b in scale_corpus.batches(d, "extra"):
        n = len(b["messages"])
        if seen + n > skip and seen < skip + count:
            lo, hi = max(0, skip - seen), min(n, skip + count - seen)
            yield fresh_ids({**b, "messages": b["messages"][lo:hi]})
        seen += n
        if seen >= skip + count:
            return


def as_sent(batch: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """A corpus batch (1,000 events) as the ingester and ``convmem import`` send it: pieces of at most
    IMPORT_BATCH_PREFERRED events, the sessions in the first, the checkpoints in the last."""
    msgs, step = batch["messages"], L.IMPORT_BATCH_PREFERRED
    starts = range(0, max(len(msgs), 1), step)
    for i, at in enumerate(starts):
        piece: dict[str, Any] = {"messages": msgs[at:at + step]}
        if i == 0 and batch.get("sessions"):
            piece["sessions"] = batch["sessions"]
        if i == len(starts) - 1 and batch.get("checkpoints"):
            piece["checkpoints"] = batch["checkpoints"]
        yield piece


class Bench:
    """One run: the directory, the daemon (at most one at a time, started when a phase needs it and
    killed by PID in ``close``), the parameters and the results so far."""

    def __init__(self, a: argparse.Namespace) -> None:
        self.a = a
        self.d = os.path.abspath(a.dir)
        self.data_dir = os.path.join(self.d, "data")
        self.results_path = os.path.join(self.d, "results.json")
        try:
            with open(self.results_path) as f:
                self.res: dict[str, Any] = json.load(f)
        except (OSError, ValueError):
            self.res = {}
        self.daemon: Daemon | None = None

    # ---------------------------------------------------------------- the daemon
    def new_daemon(self) -> Daemon:
        self.close()
        rest = [] if self.a.rest_s == RELEASE_IDLE_S else ["--release-idle-s", str(self.a.rest_s)]
        self.daemon = Daemon(self.data_dir, log_dir=os.path.join(self.d, "logs"), extra_args=rest)
        path = self.daemon.endpoint.removeprefix("ipc://")
        if len(path.encode()) > 107:
            raise SystemExit(f"--dir is too long for an ipc socket path ({path}); choose a shorter one")
        return self.daemon

    def running(self) -> Daemon:
        """The daemon on DIR/data, started (and waited for) if no phase of this run started it yet."""
        if self.daemon is None or not self.daemon.alive():
            if not os.path.isdir(self.data_dir):
                raise SystemExit(f"{self.data_dir} does not exist: run the ingest phase first")
            self.new_daemon().start(timeout=LONG_MS / 1000)
        return self.daemon

    def client(self) -> Client:
        return self.running().client(timeout_ms=LONG_MS, retries=0)

    def close(self) -> None:
        """Stop the daemon cleanly (SIGTERM: it writes its snapshot), so that a later run's phases start
        from a settled store rather than replaying what this run imported; the teardown kill after it
        only ends what did not stop."""
        if self.daemon is not None:
            if self.daemon.alive():
                try:
                    self.daemon.terminate(signal.SIGTERM, timeout=LONG_MS / 1000)
                except subprocess.TimeoutExpired:
                    pass
            self.daemon.close()
            self.daemon = None

    def settled(self, query: str) -> Daemon:
        """The running daemon once it serves ``query`` — its search index has caught up with whatever
        its start replayed or its imports queued (searches are BUSY until then) — and its background
        snapshot, if one is running, is installed: a clean stop right after leaves a snapshot with
        nothing left to index, and the next start does not begin by writing a base beside the timed
        start (a stop ends a running snapshot and writes a delta; runs of the start phase one after
        another otherwise piled deltas up, each start then due a base it never finished)."""
        d = self.running()
        with self.client() as c:
            rep = c.call("search_messages", {"query": query, "limit": LIMIT}, busy_retry=True)
            if not ok(rep):
                raise RuntimeError(f"search_messages failed: {rep}")
        deadline = time.monotonic() + LONG_MS / 1000
        while time.monotonic() < deadline:
            log = d.stderr()
            if log.rfind("background snapshot started") <= max(log.rfind(end) for end in _SNAPSHOT_ENDS):
                break
            time.sleep(0.1)
        return d

    def mem(self) -> dict[str, float]:
        return proc_mem(self.running().pid)

    def import_all(self, c: Client, batches: Iterator[dict[str, Any]]) -> int:
        """Send batches one at a time (BUSY, e.g. beside a rebuild, waited out), each cut to the size
        our own clients send (``as_sent``); returns events sent."""
        n = 0
        for b in batches:
            for piece in as_sent(b):
                rep = c.call("import_messages", piece, busy_retry=True)
                if not ok(rep):
                    raise RuntimeError(f"import_messages failed: {rep}")
            n += len(b["messages"])
        return n

    # ---------------------------------------------------------------- phases
    def gen(self) -> dict[str, Any]:
        return scale_corpus.generate(self.d, self.a.events, self.a.tail + self.a.burst, self.a.queries)

    def ingest(self) -> dict[str, Any]:
        self.close()
        shutil.rmtree(self.data_dir, ignore_errors=True)
        d = self.new_daemon().start(timeout=60)
        base = proc_mem(d.pid)
        with self.client() as c:
            t0 = time.perf_counter()
            n = self.import_all(c, scale_corpus.batches(self.d))
            dt = time.perf_counter() - t0
            health = c.health()
        out = {"events": n, "seconds": round(dt, 2), "events_per_s": round(n / dt), "rss_before": base,
               "rss_after": proc_mem(d.pid), "data_dir_mib": du_mib(self.data_dir),
               "log_size": health.get("log_size"), "snapshot_size": health.get("snapshot_size"),
               "memory_estimate": health.get("memory_estimate")}
        # and once the import's last work is done (the index caught up, its snapshot installed) and the
        # daemon has rested: what a backfilled daemon holds between a host's requests
        t1 = time.monotonic()
        self.settled(scale_corpus.queries(self.d)[0][1])
        _, rss = self.after_rest(d.pid, self.a.rest_s)
        out["settled"] = {"waited_s": round(time.monotonic() - t1, 1), "rss": rss}
        return out

    def timed_start(self, query: str) -> dict[str, Any]:
        """Spawn the daemon and time (from spawn) its first 'loaded' ping and its first OK search.
        Polls every 10 ms (the daemon answers at once while it loads; a busier poll would take the
        interpreter lock from its loader)."""
        d = self.daemon
        t0 = time.monotonic()
        d.spawn()
        ready = None
        with d.client(timeout_ms=250, retries=0) as c:
            while True:
                if not d.alive():
                    raise DaemonExited(f"daemon exited while starting:\n{d.stderr()[-3000:]}")
                if time.monotonic() - t0 > LONG_MS / 1000:
                    raise TimeoutError("daemon did not start")
                if ready is None:
                    rep = c.try_call("ping", {})
                    if ok(rep) and rep.get("pid") == d.pid and not rep.get("loading"):
                        ready = time.monotonic() - t0
                        continue
                else:
                    rep = c.try_call("search_messages", {"query": query, "limit": LIMIT})
                    if ok(rep):
                        serve = time.monotonic() - t0
                        break
                if rep is None:
                    c.reset()
                time.sleep(0.01)
        return {"ready_s": round(ready, 3), "first_search_s": round(serve, 3), "rss": proc_mem(d.pid)}

    def start(self) -> dict[str, Any]:
        query = scale_corpus.queries(self.d)[0][1]
        d = self.settled(query)
        d.terminate(signal.SIGTERM, timeout=LONG_MS / 1000)
        clean = self.timed_start(query)
        with self.client() as c:
            tail = self.import_all(c, extra_batches(self.d, 0, self.a.tail))
        d.kill()
        killed = self.timed_start(query)
        return {"clean": clean, "sigkill": {**killed, "tail_events": tail}}

    def search(self) -> dict[str, Any]:
        qs = scale_corpus.queries(self.d)
        out: dict[str, Any] = {}
        with self.client() as c:
            for op, args in (("search_messages", lambda q: {"query": q, "limit": LIMIT}),
                             ("search_sessions", lambda q: {"query": q, "n_hits": LIMIT})):
                out[op] = time_queries(qs, lambda q: c.call(op, args(q)), hits=_hits[op])
        out["rss_after"] = self.mem()
        with self.client() as c:
            out["paced"] = self.paced(c, qs)
            out["rested"] = self.rested(c, qs)
        return out

    def paced(self, c: Client, qs: list[tuple[str, str]]) -> dict[str, Any]:
        """The mix again with a pause of PACED_GAP_S after each query, as an agent between its calls:
        the daemon's RSS after each pause (the cap on its mapped pages, storaged.server.
        MAPPED_RESIDENT_CAP, is kept in the gaps, where a burst back to back outruns it) and the
        latencies."""
        pid = self.running().pid
        lat, rss = [], []
        for _, q in qs[::PACED_EVERY]:
            t0 = time.perf_counter()
            c.call("search_messages", {"query": q, "limit": LIMIT})
            lat.append(time.perf_counter() - t0)
            time.sleep(PACED_GAP_S)
            rss.append(proc_mem(pid)["VmRSS"])
        return {"gap_s": PACED_GAP_S, "queries": len(lat), "latency_ms": stats_ms(lat),
                "rss_max": max(rss), "rss_median": statistics.median(rss)}

    def rested(self, c: Client, qs: list[tuple[str, str]]) -> dict[str, Any]:
        """The daemon's memory once it has rested (server.RELEASE_IDLE_S with no request: it lets the
        resident pages of its mapped files go, the page cache keeping them), and what the first
        query of each kind after that rest costs (it maps back the pages it reads) beside the same
        query once warm again."""
        waited, m = self.after_rest(self.running().pid, self.a.rest_s)
        out: dict[str, Any] = {"waited_s": waited, "rss": m}
        first: dict[str, str] = {}
        for kind, q in qs:
            first.setdefault(kind, q)
        for label in ("after_rest_ms", "warm_ms"):
            lat = {}
            for kind, q in first.items():
                t1 = time.perf_counter()
                c.call("search_messages", {"query": q, "limit": LIMIT})
                lat[kind] = round((time.perf_counter() - t1) * 1000, 2)
            out[label] = lat
        return out

    @staticmethod
    def after_rest(pid: int, rest_s: float) -> tuple[float, dict[str, Any]]:
        """(seconds waited, the memory) once the daemon has rested and let its mapped pages go (and
        then, at the round's end, the allocator's free memory: storaged.heap), polled from /proc: a
        request would restart the daemon's rest."""
        t0 = time.monotonic()
        while True:
            by = proc_mem(pid).get("RssFile_by", {})
            if by.get("index segments", 0) + by.get("row segments", 0) < 16 or \
                    time.monotonic() - t0 > rest_s + 60:
                break
            time.sleep(0.5)
        time.sleep(1.0)   # (the round's last step, and the trim after it)
        return round(time.monotonic() - t0, 1), proc_mem(pid)

    def wait(self) -> dict[str, Any]:
        qs = scale_corpus.queries(self.d)
        heavy = [q for k, q in qs if k == "common"]
        heavy = max(heavy, key=lambda q: len(q.split())) if heavy else qs[0][1]
        d = self.running()
        out: dict[str, Any] = {"heavy_query": heavy}
        with self.client() as c:
            def heavy_search() -> dict[str, Any]:
                lat = []
                t_end = time.monotonic() + 3.0
                while time.monotonic() < t_end or len(lat) < 20:
                    t0 = time.perf_counter()
                    c.call("search_messages", {"query": heavy, "limit": LIMIT})
                    lat.append(time.perf_counter() - t0)
                return {"search": stats_ms(lat)}

            def rebuild() -> dict[str, Any]:
                # probed for --rebuild-wait-s at most (a 5M rebuild outlasts the default 600 s: its
                # probe then covers what it ran, and the next probe's daemon is still rebuilding)
                t0 = time.perf_counter()
                try:
                    rep = c.rebuild(deadline_s=self.a.rebuild_wait_s)
                except TimeoutError:
                    return {"seconds": round(time.perf_counter() - t0, 2), "ok": False, "finished": False}
                return {"seconds": round(time.perf_counter() - t0, 2), "ok": ok(rep), "finished": True}

            def burst() -> dict[str, Any]:
                log0 = d.stderr()
                t0 = time.perf_counter()
                n = self.import_all(c, extra_batches(self.d, self.a.tail, self.a.burst))
                write_s = time.perf_counter() - t0
                started = d.stderr()[len(log0):].count("background snapshot started")
                deadline = time.monotonic() + LONG_MS / 1000
                while started and time.monotonic() < deadline and not _installed(d.stderr()[len(log0):]):
                    c.call("ping", {})  # a wait on the daemon's log, not a fixed sleep
                    time.sleep(0.05)
                return {"events": n, "write_s": round(write_s, 2), "snapshot_started": bool(started),
                        "snapshot_installed": _installed(d.stderr()[len(log0):]),
                        "seconds": round(time.perf_counter() - t0, 2)}

            def first_search() -> dict[str, Any]:
                # the daemon's first request after its start maps back the pages it reads (the start
                # let go of what it read itself): its own row, so that the steady one means one thing
                t0 = time.perf_counter()
                c.call("search_messages", {"query": heavy, "limit": LIMIT})
                return {"ms": round((time.perf_counter() - t0) * 1000, 2)}

            for name, work in (("search_first", first_search), ("search", heavy_search), ("rebuild", rebuild),
                               ("snapshot", burst)):
                if name.removesuffix("_first") in self.a.wait_probes.split(","):
                    out[name] = probed(d, work)
        return out

    def write(self) -> dict[str, Any]:
        self.running()
        texts = []
        for b in scale_corpus.batches(self.d):
            texts += [m["content"] for m in b["messages"] if m["event"]["type"] in (H.USER_INPUT,
                                                                                   H.ASSISTANT_RESPONSE)]
            if len(texts) >= self.a.writes:
                break
        lat = asyncio.run(mcp_writes(self.data_dir, texts[:self.a.writes]))
        return {"how": "the SDK's stdio client -> python -m mcpfront --no-spawn -> this run's daemon on DIR/data "
                       "(the N-event store loaded)", "write_message": stats_ms(lat)}

    def fts5(self) -> dict[str, Any]:
        path = os.path.join(self.d, "fts5.sqlite")
        for suffix in ("", "-wal", "-shm"):
            if os.path.exists(path + suffix):
                os.remove(path + suffix)
        lite = SqliteHistory(path)
        turns: dict[str, int] = {}
        n = 0
        t0 = time.perf_counter()
        for b in scale_corpus.batches(self.d):
            lite.insert([_row(m, turns) for m in b["messages"]])
            n += len(b["messages"])
        dt = time.perf_counter() - t0
        size_mib = round(lite.size() / 2**20, 1)   # the database and its WAL
        lite.close()
        t0 = time.perf_counter()
        lite = SqliteHistory(path)
        qs = scale_corpus.queries(self.d)
        lite.search(fts_query(qs[0][1]), None, LIMIT)
        open_s = time.perf_counter() - t0
        out = {"events": n, "seconds": round(dt, 2), "events_per_s": round(n / dt), "size_mib": size_mib,
               "open_first_search_s": round(open_s, 3),
               "search": time_queries(qs, lambda q: lite.search(fts_query(q), None, LIMIT), hits=bool)}
        lat = []
        for i in range(self.a.writes):
            row = (str(ULID()), "codex:fts5-writes", 0, H.USER_INPUT, None, int(time.time() * 1000), f"write {i}")
            t0 = time.perf_counter()
            lite.insert([row])
            lat.append(time.perf_counter() - t0)
        out["durable_insert"] = stats_ms(lat)
        lite.close()
        return out


_hits: dict[str, Callable[[Any], bool]] = {
    "search_messages": lambda r: bool(r.get("results")),
    "search_sessions": lambda r: bool(r.get("data", {}).get("results")),
}


# what the daemon logs when a background snapshot it started is over (storaged/server.py)
_SNAPSHOT_ENDS = ("background snapshot installed", "could not install the background snapshot",
                  "background snapshot child failed")


def _installed(log: str) -> bool:
    return "background snapshot installed" in log


def _row(m: dict[str, Any], turns: dict[str, int]) -> tuple[Any, ...]:
    """An import message as SqliteHistory's row; turns counted per session as the history view does."""
    ev = m["event"]
    sid = m["session_id"]
    if ev["type"] == H.USER_INPUT:
        turns[sid] = turns.get(sid, 0) + 1
    return (m["message_id"], sid, turns.get(sid, 0), ev["type"], ev.get("tool_name"), m["timestamp"], m["content"])


def time_queries(qs: list[tuple[str, str]], run: Callable[[str], Any], hits: Callable[[Any], bool]) -> dict[str, Any]:
    """A warm-up pass (counting the queries with hits), then one timed pass: latencies per kind."""
    found: dict[str, int] = {}
    for kind, q in qs:
        r = run(q)
        if isinstance(r, dict) and r.get("status") not in (None, "OK"):
            raise RuntimeError(f"search failed: {r}")
        found[kind] = found.get(kind, 0) + bool(hits(r))
    lat: dict[str, list[float]] = {"all": []}
    for kind, q in qs:
        t0 = time.perf_counter()
        run(q)
        dt = time.perf_counter() - t0
        lat["all"].append(dt)
        lat.setdefault(kind, []).append(dt)
    return {"latency_ms": {k: stats_ms(v) for k, v in lat.items()}, "queries_with_hits": found}


def probed(d: Daemon, work: Callable[[], dict[str, Any]]) -> dict[str, Any]:
    """Run ``work`` while a probe client pings the daemon every ~5 ms on its own socket; the probe's
    latencies say how long a cheap request waited behind the work."""
    stop, live = threading.Event(), threading.Event()
    lat: list[float] = []
    lost = [0]

    def probe() -> None:
        with d.client(timeout_ms=LONG_MS, retries=0) as c:
            while not stop.is_set():
                t0 = time.perf_counter()
                if ok(c.try_call("ping", {})):
                    lat.append(time.perf_counter() - t0)
                else:
                    lost[0] += 1
                live.set()
                stop.wait(max(0.0, PROBE_EVERY_S - (time.perf_counter() - t0)))

    t = threading.Thread(target=probe, name="probe", daemon=True)
    t.start()
    live.wait(LONG_MS / 1000)   # the work starts once the probe is connected (a short one is covered too)
    try:
        res = work()
    finally:
        stop.set()
        t.join(LONG_MS / 1000)
    return {**res, "probe": {**stats_ms(lat), "over_50ms": sum(x * 1000 > WAIT_GOAL_MS for x in lat),
                             "failed": lost[0]}}


# ================================================================================ the table


def _get(res: dict[str, Any], *path: str) -> Any:
    for k in path:
        if not isinstance(res, dict) or k not in res:
            return None
        res = res[k]
    return res


def table(res: dict[str, Any]) -> list[list[Any]]:
    """[goal, ours, FTS5, target, met] rows; None where a phase has not run."""
    g = lambda *p: _get(res, *p)  # noqa: E731
    sm, ss, fs = ("search", "search_messages", "latency_ms", "all"), ("search", "search_sessions", "latency_ms",
                                                                      "all"), ("fts5", "search", "latency_ms", "all")
    rows = [
        ("daemon peak RSS during ingest (VmHWM) MiB", g("ingest", "rss_after", "VmHWM"), None, "<=", 1024),
        ("daemon RSS after ingest MiB", g("ingest", "rss_after", "VmRSS"), None, "<=", 1024),
        ("daemon RSS after ingest, settled and rested MiB", g("ingest", "settled", "rss", "VmRSS"), None, "<=", 1024),
        ("daemon RSS after clean start MiB", g("start", "clean", "rss", "VmRSS"), None, "<=", 1024),
        ("daemon RSS after the query mix MiB", g("search", "rss_after", "VmRSS"), None, "<=", 1024),
        ("daemon anonymous RSS after the query mix MiB", g("search", "rss_after", "RssAnon"), None, "<=", 1024),
        ("daemon RSS during the mix paced (max after each gap) MiB", g("search", "paced", "rss_max"), None,
         "<=", 1024),
        ("daemon RSS after the mix and a rest MiB", g("search", "rested", "rss", "VmRSS"), None,
         "<=", 1024),
        ("start after clean stop, until it serves a search s", g("start", "clean", "first_search_s"),
         g("fts5", "open_first_search_s"), "<=", 2),
        ("start after SIGKILL (tail replayed), until it serves a search s", g("start", "sigkill", "first_search_s"),
         None, "<=", 5),
        ("search_messages p50 ms", g(*sm, "p50"), g(*fs, "p50"), "<=", 10),
        ("search_messages p99 ms", g(*sm, "p99"), g(*fs, "p99"), "<=", 100),
        ("search_sessions p50 ms", g(*ss, "p50"), g(*fs, "p50"), "<=", 10),
        ("search_sessions p99 ms", g(*ss, "p99"), g(*fs, "p99"), "<=", 100),
        ("longest wait behind the heaviest search's first request after a start ms",
         g("wait", "search_first", "probe", "max"), None, "<=", WAIT_GOAL_MS),
        ("longest wait behind the heaviest search (steady) ms", g("wait", "search", "probe", "max"), None, "<=",
         WAIT_GOAL_MS),
        ("longest wait behind rebuild_index ms", g("wait", "rebuild", "probe", "max"), None, "<=", WAIT_GOAL_MS),
        ("longest wait behind a write burst + background snapshot ms", g("wait", "snapshot", "probe", "max"), None,
         "<=", WAIT_GOAL_MS),
        ("ingest events/s", g("ingest", "events_per_s"), g("fts5", "events_per_s"), ">=", 20_000),
        ("durable write p50 ms (ours: MCP stdio, SDK client; FTS5: one-row commit)",
         g("write", "write_message", "p50"), g("fts5", "durable_insert", "p50"), "<", 2),
        ("on disk MiB", g("ingest", "data_dir_mib"), g("fts5", "size_mib"), None, None),
    ]
    out = []
    for label, ours, theirs, op, goal in rows:
        if op is None or ours is None:
            met = "-"
        else:
            met = "met" if {"<=": ours <= goal, ">=": ours >= goal, "<": ours < goal}[op] else "NOT met"
        out.append([label, "-" if ours is None else ours, "-" if theirs is None else theirs,
                    f"{op} {goal}" if op else "-", met])
    return out


# ================================================================================ CLI


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--events", type=int, default=5_000_000, help="corpus size (default: issue 15's 5M)")
    p.add_argument("--dir", default="/tmp/convmem-scale", help="everything goes here (corpus, data, SQLite)")
    p.add_argument("--phases", default=",".join(PHASES), help=f"comma-separated, of {','.join(PHASES)}")
    p.add_argument("--queries", type=int, default=400, help="query mix size")
    p.add_argument("--tail", type=int, help="events written before the SIGKILL (default: N/10, at most 20k)")
    p.add_argument("--burst", type=int, help="events of the write burst (default: enough for a background "
                                             "snapshot from 100k events on, else N/4)")
    p.add_argument("--writes", type=int, default=300, help="durable writes timed (ours and FTS5)")
    p.add_argument("--wait-probes", default="search,rebuild,snapshot",
                   help="the wait phase's probes, comma-separated (a rebuild_index of 5M events takes ~20 min)")
    p.add_argument("--rebuild-wait-s", type=float, default=3600.0,
                   help="how long the rebuild probe waits for the rebuild's end (then it reports finished: false)")
    p.add_argument("--rest-s", type=float, default=RELEASE_IDLE_S,
                   help="the daemon's --release-idle-s: the rest after which it lets its mapped pages (and the "
                        f"allocator's free memory) go, which the RSS after a rest waits for (default {RELEASE_IDLE_S:.0f})")
    p.add_argument("--json", help="write every result here too")
    a = p.parse_args(argv)
    a.tail = min(a.events // 10, 20_000) if a.tail is None else a.tail
    if a.burst is None:
        a.burst = SNAPSHOT_EVERY_RECORDS + 5_000 if a.events >= 100_000 else a.events // 4
    unknown = set(a.phases.split(",")) - set(PHASES)
    if unknown:
        p.error(f"unknown phases: {', '.join(sorted(unknown))}")
    if set(a.wait_probes.split(",")) - {"search", "rebuild", "snapshot"}:
        p.error("--wait-probes takes search, rebuild and snapshot")
    return a


def main(argv: list[str] | None = None) -> dict[str, Any]:
    a = parse_args(argv)
    os.makedirs(a.dir, exist_ok=True)
    b = Bench(a)
    wanted = a.phases.split(",")
    t_all = time.perf_counter()
    try:
        for phase in PHASES:
            if phase in wanted:
                t0 = time.perf_counter()
                print(f"[scale] {phase} ...", file=sys.stderr, flush=True)
                b.res[phase] = {**getattr(b, phase)(), "phase_s": round(time.perf_counter() - t0, 1)}
                print(f"[scale] {phase} done in {b.res[phase]['phase_s']} s", file=sys.stderr, flush=True)
                with open(b.results_path, "w") as f:
                    json.dump(b.res, f, indent=1, ensure_ascii=False)
    finally:
        b.close()
    b.res["last_run"] = {"phases": wanted, "wall_s": round(time.perf_counter() - t_all, 1),
                         "events": a.events, "at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    b.res["table"] = table(b.res)
    with open(b.results_path, "w") as f:
        json.dump(b.res, f, indent=1, ensure_ascii=False)
    g = b.res.get("gen", {})
    print_table(f"Issue 15 at {g.get('messages', a.events):,} events ({g.get('text_mib')} MiB of text), "
                f"convmem beside SQLite FTS5", b.res["table"], ["goal", "convmem", "FTS5", "target", "met"])
    if a.json:
        with open(a.json, "w") as f:
            json.dump(b.res, f, indent=1, ensure_ascii=False)
    return b.res


if __name__ == "__main__":
    main()
