"""The request loop: one ZeroMQ ROUTER socket serving REQ clients, one request at a time, a
rebuild beside it.

ROUTER rather than REP: libzmq's REP (4.3.5) loses the next client's reply after a peer sent a
multi-frame message without the REQ delimiter and went away (router_t::rollback leaves its
``_more_out`` set when the peer's pipe is gone). Handling the REQ envelope here avoids that path.

An ``import_messages`` (up to a thousand messages, ~0.2 s of work) is not handled at once: it is
validated and stored a slice at a time (``_import_slice``; each stored slice is its own durable
commit), one slice after each batch of other requests, so nobody waits behind a whole import. Imports
go one after another in the order they came (at most IMPORTS_MAX taken at once, the rest answered
BUSY); a ``rebuild_index`` asked for meanwhile starts once they are done (new imports are answered BUSY
until then); a clean stop finishes them.

All socket calls stay in this thread. Requests taken off the socket together are handled in order
and share one fdatasync before any of their replies leaves (group commit, ``_serve_batch``). A
snapshot is written now and then by a forked child that sees a frozen copy of the state, so a
start after a crash replays a bounded tail. A rebuild runs in a forked worker too
(``compaction.run_child``), which writes the new log, segment and snapshot from its frozen image and
leaves its result in a file; the loop sees it exit (``waitpid`` between requests) and installs the
result. Meanwhile mutations are answered BUSY at once and reads are served from the unchanged state.

The store itself may be opened by a worker thread too (``load_in_background``): the socket is bound
first and every request gets a clear, retryable answer while the log is replayed — BUSY for the
memory tools, the history tools' ``read_model_refresh`` — instead of a client timing out on a
daemon that has not started to listen yet.
"""
from __future__ import annotations

import gc
import logging
import os
import signal
import threading
import time
import traceback
from collections import deque
from typing import Any, Callable, Generator

import zmq

from protocol import errors as E
from protocol import history as H
from protocol import limits as L
from protocol import requests as R
from protocol import validation as V
from protocol import wire
from protocol.errors import ProtocolError, error_reply
from protocol.history import HistoryError

from . import children, compaction, heap, layout, views
from .fileio import dropping_pages, file_resident_bytes, release_now
from .history import HistoryViews
from .text import TextDamaged
from .history import handlers as history_handlers
from .store import SplitCatchUp, Store

LOG = logging.getLogger("convmem.storaged")

# A snapshot is taken in the background (by a forked child, which sees a frozen copy-on-write image
# of the state, the way Redis does it) once this much log lies beyond it, so that a start after a
# crash replays a bounded tail instead of everything since the last clean stop. Since row segments
# (snapshot.py) one writes the rows changed since the one before, not every row, and since the index
# segments hold their slots' docs and lengths (segment.py) the manifest is ~1 bit a message beside
# what changed, so they can be five times as frequent as before (50 000 / 64 MiB). Not more: at 200k
# events a child takes 5-10 s (indexing what was queued, merging segments), so under a bulk import
# they run back to back whatever the period, and 5 000 (bench/SPIKES.md, part 6) cost ingest ~12% and
# left a longer tail at a SIGKILL (the snapshot installed last was a child's time older).
SNAPSHOT_EVERY_RECORDS = 10_000
SNAPSHOT_EVERY_BYTES = 16 * L.MiB
SNAPSHOT_CHILD_MAX_S = 600.0
# A background snapshot whose child failed (or whose install did) is tried again after SNAPSHOT_RETRY_S,
# doubled at each failure in a row up to SNAPSHOT_RETRY_MAX_S: a snapshot that is still due (a base, say)
# was otherwise forked again at every turn of the loop, ~10 a second, for as long as it failed.
SNAPSHOT_RETRY_S = 1.0
SNAPSHOT_RETRY_MAX_S = 60.0

# Requests taken off the socket at once and committed with one fdatasync (group commit).
GROUP_MAX = 64
EXIT_FSYNC_FAILED = 75

# Frames above this are dropped by libzmq itself (the peer is disconnected) to bound memory;
# frames between MAX_REQUEST_BYTES and this get a clear VALIDATION_ERROR reply.
HARD_FRAME_CAP = 4 * L.MAX_REQUEST_BYTES
# A batch stops taking requests off the socket once it holds this many bytes of frames, so that
# GROUP_MAX frames near HARD_FRAME_CAP (1 GiB) are never held at once.
GROUP_MAX_BYTES = 2 * L.MAX_REQUEST_BYTES
# Replies queued for one peer that does not read them. A legitimate client is a REQ socket (one
# request in flight, so one reply queued at most); a peer that pipelines requests and never reads
# (a raw DEALER) would otherwise make libzmq queue 1000 replies of up to RESPONSE_BUDGET_BYTES each.
# With ROUTER_MANDATORY a send to a full (or vanished) peer fails at once instead of being dropped
# silently: the reply is dropped and counted, never waited for — the loop serves everyone else.
# Memory held for such a peer stays near (REPLY_HWM + what the kernel buffers) x the reply budget.
REPLY_HWM = 4
# Replies of a group-committed batch that wait for its shared fdatasync are held at most to this many
# bytes: beyond, the batch syncs early and sends them (message text is read from the log, so every
# reply holds its own copy of the text — a batch of big reads must not hold them all).
HELD_REPLY_BYTES = 2 * L.RESPONSE_BUDGET_BYTES
REBUILD_RESULTS_KEPT = 32
POLL_MS = 100
IDLE_SLICE_S = 0.02  # background work done at once while no request waits (it stops when one arrives)
# After RELEASE_IDLE_S with no request (and no background work left) the loop lets the process's
# resident pages of its file mappings go, one mapping an idle turn (Store.release_pages_step): the
# page cache keeps them, so the next query maps back what it reads (at 5M events dropping them before
# every query cost the mix's p50 ~4 ms) and meanwhile a resting daemon's RSS is its own memory, not
# the ~2 GB of postings its last queries read. An interactive host's queries come seconds apart,
# well inside it. At the round's end the C allocator gives back the free memory it keeps (heap.trim).
# 0 (--release-idle-s 0): never.
RELEASE_IDLE_S = 30.0
# A burst of queries that never leaves the daemon at rest that long maps what it reads all the same: at
# 5M events the query mix left 2.7 GB of postings and rows resident through the mappings, counted as the
# daemon's RSS. After a batch the loop looks (at most every MAPPED_CHECK_S) whether the process's
# resident file pages pass MAPPED_RESIDENT_CAP, and once they do lets them go
# (Store.release_pages_while) down to half of it, a 1 MiB window at a time while no request waits, in
# turns of at most MAPPED_RELEASE_S that go on in idle turns. Why only in the gaps: a query at 5M events
# reads ~100 MB of postings, and letting them go and mapping them back costs ~0.1 µs a page each way —
# turns that ran whatever waited kept the mix's RSS at 946 MiB but cost its p50 4-6 ms. So a client
# that leaves gaps (an agent between calls) keeps the cap (the 5M mix paced at 50 ms: 974 MiB at most
# instead of 3.3 GB), and a burst back to back is served first. A round that left them over the cap
# (pages nobody may drop) waits MAPPED_BACKOFF_S. 0 (--mapped-resident-mib 0): no cap.
MAPPED_RESIDENT_CAP = 256 << 20
MAPPED_RESIDENT_MIN = 64 << 20   # the smallest cap taken: the code's own pages are ~25 MB of it
MAPPED_CHECK_S = 0.02
MAPPED_RELEASE_S = 0.003
MAPPED_BACKOFF_S = 1.0
# A background snapshot's base of every row is mapped in place of the rows the daemon holds in memory
# (Store.rebase_step: at 5M events 430 MB of them after an import), checked against them this many
# rows a step: an idle turn's, and after each batch a smaller one (a backfill never leaves the loop
# idle). 65,536 rows are 5.6 MB, compared in ~3 ms.
REBASE_ROWS = 65_536
REBASE_ROWS_BUSY = 16_384
# A step of the loop that holds every client longer than NOTED_STEP_S is logged with what it was (a
# batch's ops, a background snapshot's start or install, idle work): the goal is that nobody waits
# 50 ms behind another, and the line says which step to look at when a client waited longer (info;
# a warning beyond SLOW_STEP_S).
NOTED_STEP_S = 0.05
SLOW_STEP_S = 0.25
# An import is validated and stored a slice at a time between other requests (_import_slice); a slice
# takes about this long (plus at most one store slice: storaged.store.IMPORT_SLICE_MESSAGES)
IMPORT_SLICE_S = 0.01
# imports taken at once (queued in order); more are answered BUSY: each holds its decoded batch
IMPORTS_MAX = 8
# the replies kept for retries of imports already stored (Server.import_results); in memory only:
# a retry after a restart finds its messages stored and is answered "existing" for them
IMPORT_RESULTS_KEPT = 256
BUSY_INDEX_SLICE_S = 0.005  # indexing done after each batch and import slice, so the queue drains under load too
# ... and what a start left for idle time (its sessions, file touches), when the loop has had no idle
# moment for it in LATER_STARVED_S (a synchronous client leaves one between its requests: a step there
# costs a request that arrives meanwhile ~0.3 ms, where a slice after every batch cost each ~1 ms)
BUSY_LOAD_SLICE_S = 0.005
LATER_STARVED_S = 0.25
# messages moved to a compacted log per idle step / after each batch or import slice (Store.relocate_step;
# ~1.5 µs each, up to ~6.5 at 5M events on a busy machine: a step of 8192 held the loop 50-54 ms)
RELOCATE_STEP = 4096
RELOCATE_STEP_BUSY = 1024
# When at least SPLIT_MIN messages are queued for the search index (a start's replayed tail, an import's
# backlog) the loop hands the first SPLIT_SHARE of them to a forked child (Store.split_catch_up), which
# indexes them on the other core while the loop indexes the rest and serves requests: a start after a
# crash serves its first search sooner, and an import is indexed on two cores. Below SPLIT_MIN the fork
# and the child's segment cost more than they save. While the child runs the loop polls every
# SPLIT_POLL_MS (it notices the end soon), and a clean stop waits up to SPLIT_STOP_WAIT_S for it before
# giving its part back to the queue.
SPLIT_MIN = 4_000
SPLIT_SHARE = 0.5
SPLIT_POLL_MS = 5
SPLIT_STOP_WAIT_S = 5.0
# after a child that failed (a full disk, say), the loop indexes alone this long: a child failing again
# and again would otherwise keep taking the front of the queue back, and searches answered BUSY
SPLIT_RETRY_S = 60.0
# messages the index caught up on since the snapshot: worth a new one — as many as make a catch-up child
# worth its fork, which is also the queue a background snapshot's child leaves to the loop (plan_snapshot's
# catch_up), so the snapshot after such a one holds what it left queued
INDEXED_SINCE_SNAPSHOT = SPLIT_MIN
# the most a start's replayed tail holds background snapshots back while the loop indexes it
# (Server._background_snapshot): ~10 s of indexing at 300 us a message for a tail of 30k
REPLAY_CATCH_UP_MAX_S = 60.0
# A search first indexes what is queued, for up to SEARCH_CATCH_UP_S when at most
# SEARCH_CATCH_UP_SMALL messages are queued (a host's own recent writes: it reads them back, not a
# BUSY), else for SEARCH_CATCH_UP_BIG_S only — every client waits behind it, and a restart's replayed
# tail made each search hold the loop 250 ms — then answers BUSY: the rest is indexed in the idle and
# after-batch slices, and the BUSY's retry_after_ms brings the search back.
SEARCH_CATCH_UP_S = 0.25
SEARCH_CATCH_UP_SMALL = 500
SEARCH_CATCH_UP_BIG_S = 0.04
# imports wait (BUSY) while this many messages are queued for the search index: a few seconds of
# indexing, which a clean stop's STOP_INDEX_BUDGET_S mostly covers
INDEX_QUEUE_MAX = 10_000
ZAP_DOMAIN = "convmem"


def _after_catch_up(store: Store, handler: Callable[[Any, str | None], dict[str, Any]]):
    """A search op's handler that first lets the search index catch up (``Store.catch_up``)."""
    def searching(args: Any, rid: str | None) -> dict[str, Any]:
        store.catch_up(SEARCH_CATCH_UP_S if len(store.unindexed) <= SEARCH_CATCH_UP_SMALL else SEARCH_CATCH_UP_BIG_S)
        return handler(args, rid)
    return searching


def _remember(results: dict[str, dict[str, Any]], rid: str, reply: dict[str, Any], kept: int) -> None:
    """Keep ``reply`` as the answer to a retry of request ``rid``, the oldest forgotten past ``kept``."""
    results[rid] = reply
    while len(results) > kept:
        del results[next(iter(results))]


def _exit_reason(code: int) -> str:
    if code < 0:
        sig = -code
        return f"killed by signal {sig}" + ("; out of memory?" if sig == signal.SIGKILL else "")
    return f"exit code {code}"


class Server:
    def __init__(self, store: Store | None, endpoint: str, curve_secret_key: bytes | None = None,
                 curve_clients_dir: str | None = None) -> None:
        self.store: Store | None = None
        self.endpoint = endpoint
        self.ctx = zmq.Context.instance()
        # What ping says about the store served (store_id, data_dir): front-ends check it.
        self.identity: dict[str, Any] = {}
        self.authenticator: Any = None
        self.sock = self.ctx.socket(zmq.ROUTER)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.setsockopt(zmq.MAXMSGSIZE, HARD_FRAME_CAP)
        self.sock.setsockopt(zmq.SNDHWM, REPLY_HWM)
        self.sock.setsockopt(zmq.ROUTER_MANDATORY, 1)
        self.replies_dropped = 0
        if curve_secret_key is not None:
            if curve_clients_dir is not None:
                # ZAP: only clients whose public key has a certificate in the directory get through the
                # handshake (the others get no connection, hence no reply). Started before the bind.
                # libzmq 4.3.5 asks ZAP about a CURVE peer only when the socket has a ZAP domain (with an
                # empty one every key passes, whatever the handler says), so the domain is named on both
                # sides; ZAP_ENFORCE_DOMAIN makes a missing handler deny rather than allow everyone.
                from zmq.auth.thread import ThreadAuthenticator

                self.authenticator = ThreadAuthenticator(self.ctx, log=logging.getLogger("convmem.storaged.zap"))
                self.authenticator.start()
                self.authenticator.configure_curve(domain=ZAP_DOMAIN, location=curve_clients_dir)
                self.sock.zap_domain = ZAP_DOMAIN.encode()
                self.sock.setsockopt(zmq.ZAP_ENFORCE_DOMAIN, 1)
            self.sock.curve_secretkey = curve_secret_key
            self.sock.curve_server = True
        self.wake_addr = f"inproc://convmem-loaded-{id(self)}"
        self.wake_recv = self.ctx.socket(zmq.PAIR)
        self.wake_recv.bind(self.wake_addr)
        self.stopping = False
        self.rebuild_id: str | None = None
        self.rebuild_child: int | None = None  # the pid of the rebuild's forked worker
        # what the worker left, read once it exited and installed at the loop's next turn:
        # ("ok", Prepared) | ("error", reply) | ("cancelled", None)
        self.rebuild_outcome: tuple[str, Any] | None = None
        self.rebuild_reading: Generator[None, None, tuple[str, Any]] | None = None  # read_result_steps, under way
        self.rebuild_step_at = ""  # where its last step stopped (protocol.requests.paused_at), for the slow-step note
        self.rebuild_results: dict[str, dict[str, Any]] = {}
        self.rebuild_started = 0.0
        # (pid, log position, started, the segment plan it writes, the segment names it lists)
        self.snapshot_child: tuple | None = None
        self.snapshot_failures = 0      # background snapshots failed in a row
        self.snapshot_retry_at = 0.0    # (monotonic) none is started before this after a failure
        self.split: tuple[int, SplitCatchUp] | None = None  # (pid, what it indexes): the catch-up child
        self.split_failed = -SPLIT_RETRY_S  # when the last catch-up child failed (monotonic)
        self.snapshot_every_records = SNAPSHOT_EVERY_RECORDS  # 0 turns background snapshots off
        self.handlers: dict[str, Callable[[Any, str], dict[str, Any]]] = {}  # op -> handler(request, rid)
        # imports in progress, oldest first: (the envelopes of its requesters, its request id, its steps)
        self.imports: deque[tuple[list[list[bytes]], str, Generator[None, None, dict[str, Any]]]] = deque()
        # the replies of the last imports stored, by request id: what a retry of one is answered
        self.import_results: dict[str, dict[str, Any]] = {}
        self.loader: threading.Thread | None = None
        self._gc_started = 0.0
        self.rebuild_waiting = False  # a rebuild_index asked for while imports were in progress (rebuild_id)
        self._freeze_due = False  # a full collection ran: freeze its survivors (_on_collection)
        self._later_at = time.monotonic()   # the last step of what a start left for idle time (_load_later)
        self.release_idle_s = RELEASE_IDLE_S
        self._active_at = time.monotonic()   # the last batch of requests (RELEASE_IDLE_S counts from it)
        self._pages_let_go = False   # a round of Store.release_pages_step has ended since then
        self.mapped_resident_cap = MAPPED_RESIDENT_CAP
        self._slowest_op = ("", 0.0)   # (op, seconds) of the batch being served: what a slow one logs
        self._mapped_next = 0.0      # (monotonic) when _cap_mapped looks next
        self._mapped_over = False    # letting go down to half the cap, in turns
        self.load_outcome: tuple[str, Any] | None = None
        self.load_error: BaseException | None = None
        self.on_loaded: Callable[[Store], None] | None = None
        if store is not None:
            self.install_store(store)

    def install_store(self, store: Store) -> None:
        """Start serving ``store``: every op gets its handler."""
        store.index_queue_max = INDEX_QUEUE_MAX
        self._hold_snapshots_for_queue(store)
        history = HistoryViews(store)
        self.handlers = {
            "ping": self._ping,
            "write_message": lambda a, rid: store.write_message(a, rid),
            "update_message": lambda a, rid: store.update_message(a, rid),
            "delete_message": lambda a, rid: store.delete_message(a, rid),
            "read_messages": lambda a, rid: views.read_messages(store, a),
            "search_messages": _after_catch_up(store, lambda a, rid: views.search_messages(store, a)),
            "get_system_health": self._health,
            "rebuild_index": self._rebuild_index,
            "rebuild_status": self._rebuild_status,
            "import_messages": lambda a, rid: store.import_messages(a, rid),
            "export_messages": lambda a, rid: views.export_messages(store, a),
            "ingest_heartbeat": self._ingest_heartbeat,
            "ingest_checkpoints": lambda a, rid: {"status": "OK",
                                                  "checkpoints": store.ingest.of_source(a.source)},
        }
        for op, fn in history_handlers(history, lambda: store.rebuilding).items():
            self.handlers[op] = lambda a, rid, fn=fn: fn(a)
        self.handlers["search_sessions"] = _after_catch_up(store, self.handlers["search_sessions"])
        self.store = store

    def load_in_background(self, open_store: Callable[[], Store]) -> None:
        """Open the store in a worker thread while the loop answers "loading" (call after bind). No cyclic
        GC meanwhile: each full collection would walk every object loaded so far holding the GIL (a
        "loading" reply waited over a second behind one at 275k messages); it resumes, with the
        loaded structures frozen out of its sight, when the load ends (_finish_load)."""
        def work() -> None:
            gc.disable()
            try:
                self.load_outcome = ("ok", open_store())
            except BaseException as exc:  # reported by the loop, which then stops the daemon
                self.load_outcome = ("error", exc)
            wake = self.ctx.socket(zmq.PAIR)
            wake.connect(self.wake_addr)
            wake.send(b"loaded")
            wake.close(linger=1000)

        self.loader = threading.Thread(target=work, name="load", daemon=True)
        self.loader.start()

    def _finish_load(self) -> None:
        self.loader.join()
        self.loader = None
        kind, value = self.load_outcome
        try:
            if kind == "error":
                LOG.critical("could not open the store: %s", value)
                self.load_error = value
                self.stopping = True
                return
            if self.on_loaded is not None:
                self.on_loaded(value)
            # what was loaded lives as long as the process: out of the full collections' sight, so that none
            # walks a million messages while a request waits (the Instagram gc.freeze trick)
            gc.freeze()
            self.install_store(value)
        finally:
            gc.enable()

    def bind(self) -> None:
        self.sock.bind(self.endpoint)

    # ---------------------------------------------------------------- the loop
    def serve(self) -> None:
        gc.callbacks.append(self._on_collection)
        try:
            self._serve()
        finally:
            gc.callbacks.remove(self._on_collection)

    def _on_collection(self, phase: str, info: dict[str, int]) -> None:
        """A ``gc.callbacks`` hook. After a full collection the loop freezes what survived it
        (``_freeze_survivors``): what a store holds lives long, and a full collection walks every
        object not frozen — at 200k messages the index's live lists and the messages written since
        the start made each one 60-130 ms (300 ms on the loaded machine) every few seconds of an
        import burst. Only cyclic garbage that outlived a full collection is never freed then; the
        store makes none (refcounting frees everything else as before). A slow one is logged."""
        if phase == "start":
            self._gc_started = time.monotonic()
            return
        took = time.monotonic() - self._gc_started
        if info["generation"] == 2:
            self._freeze_due = True
        if took > NOTED_STEP_S:
            LOG.log(logging.WARNING if took > SLOW_STEP_S else logging.INFO,
                    "a garbage collection of generation %d took %.0f ms", info["generation"], took * 1000)

    def _freeze_survivors(self) -> None:
        if self._freeze_due:
            self._freeze_due = False
            gc.freeze()

    def _serve(self) -> None:
        poller = zmq.Poller()
        poller.register(self.sock, zmq.POLLIN)
        poller.register(self.wake_recv, zmq.POLLIN)
        while not self.stopping:
            # while an import is in progress, messages move to a compacted log, the search index has a
            # queue or a base is taking the rows' place, poll without waiting: idle time goes to them
            store = self.store
            busy = self.imports or self.rebuild_reading or self.rebuild_outcome or self._mapped_over or (
                store is not None and (store.unindexed or store.relocation or store.loading_later
                                       or store.table.rebasing))
            events = dict(poller.poll(0 if busy else SPLIT_POLL_MS if self.split else POLL_MS))
            if self.wake_recv in events:
                t0 = time.monotonic()
                self.wake_recv.recv()
                self._finish_load()
                self._note_slow(t0, lambda: "installing the loaded store")
            if self.sock in events:
                batch = []
                size = 0
                while len(batch) < GROUP_MAX and size < GROUP_MAX_BYTES:
                    try:
                        frames = self.sock.recv_multipart(zmq.NOBLOCK)
                    except zmq.Again:
                        break
                    envelope, body = split_envelope(frames)
                    if envelope is not None:  # without a REQ delimiter it is no request (REP drops these too)
                        batch.append((envelope, body))
                        size += sum(map(len, body))
                if batch:
                    t0 = self._active_at = time.monotonic()
                    if self.store is not None:
                        self._pages_let_go = False
                        self.store.release_pages_restart()
                    self._slowest_op = ("", 0.0)
                    self._serve_batch(batch)
                    t1 = time.monotonic()
                    self._busy_work()
                    self._note_slow(t0, lambda: self._batch_said(len(batch), t1))
            if self.imports:
                # one slice of the oldest import after every batch, so it advances under any load and
                # nobody waits behind more than one slice of it
                t0 = time.monotonic()
                self._import_slice(IMPORT_SLICE_S)
                self._busy_work()
                self._note_slow(t0, lambda: "a slice of an import")
                if self.rebuild_waiting and not self.imports:
                    self._start_waiting_rebuild()
            elif not events and self.store is not None:
                t0 = time.monotonic()
                self._idle_work()
                self._note_slow(t0, lambda: "idle work (indexing, the prefix list, freeing replaced lists)")
            if self.rebuild_child is not None:
                code = children.reap(self.rebuild_child, block=False)
                if code is not None:  # its result is read and installed over the next turns, so that
                    t0 = time.monotonic()  # the requests that come meanwhile wait behind one step only
                    self._rebuild_exited(code)
                    self._note_slow(t0, lambda: f"reading the rebuild's result (to {self.rebuild_step_at})")
            elif self.rebuild_reading is not None:
                t0 = time.monotonic()
                self._read_rebuild_step()
                self._note_slow(t0, lambda: f"reading the rebuild's result (to {self.rebuild_step_at})")
            elif self.rebuild_outcome is not None:
                t0 = time.monotonic()
                self._finish_rebuild()
                self._note_slow(t0, lambda: "installing the rebuilt log, snapshot and index")
            if self.split is not None:
                self._reap_split(block=False)
            if self.store is not None and self.store.index_check is not None:
                self._take_index_check()
            if self.store is not None:
                t0 = time.monotonic()
                self._background_snapshot()
                self._note_slow(t0, lambda: "a background snapshot's start or install")
                if self.split is None and self.snapshot_child is None:
                    t0 = time.monotonic()
                    self._start_split()
                    self._note_slow(t0, lambda: "forking the search index's catch-up child")
            self._freeze_survivors()
        while self.imports:  # a clean stop finishes the imports in progress and answers them
            self._import_slice(None)

    def _busy_work(self) -> None:
        """The background work done after each batch and each import slice, in small steps, so that
        it advances under a load that never leaves the loop idle (an ingester's backfill)."""
        if self.store is not None:
            self._cap_mapped()
            self.store.release_index_step()
            self.store.relocate_step(RELOCATE_STEP_BUSY)
            self.store.rebase_step(REBASE_ROWS_BUSY)
            if self.store.unindexed:
                self.store.index_step(time.monotonic() + BUSY_INDEX_SLICE_S, self._request_waiting)
            if self.store.loading_later and time.monotonic() - self._later_at > LATER_STARVED_S:
                # a load that never leaves the loop idle (reads back to back, an ingester's writes,
                # whose own messages always queue for the index) would hold a start's leftovers off
                self._load_later(time.monotonic() + BUSY_LOAD_SLICE_S, None)

    def _cap_mapped(self) -> None:
        """Keep the resident pages of the store's mappings under ``mapped_resident_cap`` while requests
        come (MAPPED_RESIDENT_CAP says why)."""
        now = time.monotonic()
        if not self.mapped_resident_cap or (now < self._mapped_next and not self._mapped_over) \
                or not dropping_pages():
            return
        self._mapped_next = now + MAPPED_CHECK_S
        resident = file_resident_bytes()
        if resident is None or (not self._mapped_over and resident <= self.mapped_resident_cap):
            return
        low = self.mapped_resident_cap // 2

        def over_low() -> bool:   # (only while no request waits: in the gaps between them)
            if self._request_waiting():
                return False
            r = file_resident_bytes()
            return r is not None and r > low

        stopped = self.store.release_pages_while(over_low, now + MAPPED_RELEASE_S)
        resident = file_resident_bytes() or 0
        self._mapped_over = stopped and resident > low
        if not stopped and resident > self.mapped_resident_cap:
            self._mapped_next = time.monotonic() + MAPPED_BACKOFF_S   # nothing more it may let go now

    def _load_later(self, deadline: float, interrupted: Callable[[], bool] | None) -> None:
        self._later_at = time.monotonic()
        self.store.load_later_step(deadline, interrupted)
        if not self.store.loading_later:
            LOG.info("the start's sessions, history ids and file touches are loaded (%d sessions)",
                     len(self.store.sessions))

    def _batch_said(self, n: int, served_at: float) -> str:
        """What a slow batch was, for the log: its slowest request, and the busy work after it."""
        op, took = self._slowest_op
        return (f"a batch of {n} request(s) (the slowest: {op or '?'}, {took * 1000:.0f} ms; the busy work "
                f"after it {(time.monotonic() - served_at) * 1000:.0f} ms)")

    @staticmethod
    def _note_slow(t0: float, what: Callable[[], str]) -> None:
        took = time.monotonic() - t0
        if took > NOTED_STEP_S:
            LOG.log(logging.WARNING if took > SLOW_STEP_S else logging.INFO,
                    "the request loop was busy %.0f ms with %s", took * 1000, what())

    def _serve_batch(self, batch: list[tuple[list[bytes], list[bytes]]]) -> None:
        """Group commit: the requests that arrived together are handled in order, their appends
        share one fdatasync, and no reply of the batch leaves before it — so no client ever sees
        (or is told of) a change that is not yet on disk.

        If that shared fdatasync fails, the batch's changes are in memory but maybe not on disk and
        cannot be taken back one by one: the daemon exits at once without a reply (the way databases
        treat a failed fsync). Clients retry with the same request ids; the restarted daemon
        replays what reached the disk and applies the rest exactly once. A batch of one request
        keeps the per-request path, whose failed fsync is undone and answered IO_ERROR."""
        store = self.store
        if store is None:  # still loading: nothing can be written, every answer is "come back later"
            for envelope, body in batch:
                self._reply(envelope, self.handle(body))
            return
        store.group_commit = len(batch) > 1
        held: list[tuple[list[bytes], bytes]] = []
        held_bytes = 0
        try:
            for envelope, body in batch:
                reply = self.handle(body, envelope)
                if reply is None:  # an import, stored in slices by the loop; it replies when done
                    continue
                data = wire.encode(reply)
                if not store.unsynced:
                    # nothing of this batch awaits the disk, so this reply can tell of nothing unsynced:
                    # it leaves now (a batch of big reads then never holds all its replies at once)
                    self._send(envelope, data)
                    continue
                held.append((envelope, data))
                held_bytes += len(data)
                if held_bytes >= HELD_REPLY_BYTES:
                    self._sync_batch(len(batch))
                    self._send_all(held)
                    held, held_bytes = [], 0
        finally:
            store.group_commit = False
        self._sync_batch(len(batch))
        self._send_all(held)

    def _idle_work(self) -> None:
        """Background steps while no request waits: moving messages to a compacted log, then the search
        index's (at most IDLE_SLICE_S, and never past the arrival of a request)."""
        deadline = time.monotonic() + IDLE_SLICE_S
        if self._mapped_over:   # a gap between requests: the mapped-page cap's release goes on in it
            self._cap_mapped()
            return
        if self.store.relocate_step(RELOCATE_STEP):
            return
        if self.store.rebase_step(REBASE_ROWS):
            return
        if self.store.unindexed:
            self.store.index_step(deadline, self._request_waiting)
            return
        if self.store.loading_later:   # a start's sessions and file touches (Store.load_later_step)
            self._load_later(deadline, self._request_waiting)
            return
        index = self.store.search
        while index.idle_step() and time.monotonic() < deadline and not self._request_waiting():
            pass
        # the usual search_sessions filter's verdicts by slot, made ahead (SearchIndex.keep_ahead)
        usual = self.store.etype_filter(H.DEFAULT_SEARCH_EVENT_TYPES)
        ahead = True   # (False: keep_ahead, which runs once idle_step is done, has nothing left either)
        while time.monotonic() < deadline and not self._request_waiting() and (ahead := index.keep_ahead(usual)):
            pass
        if (not ahead and self.release_idle_s and not self._pages_let_go and not self._request_waiting()
                and time.monotonic() - self._active_at >= self.release_idle_s):
            self._pages_let_go = not self.store.release_pages_step()
            if self._pages_let_go:   # (once a rest) and what the allocator keeps of what was freed
                t0 = time.monotonic()
                heap.trim()
                self._note_slow(t0, lambda: "giving the allocator's free memory back (malloc_trim)")

    def _request_waiting(self) -> bool:
        return bool(self.sock.poll(0))

    def _sync_batch(self, n: int) -> None:
        store = self.store
        if store.unsynced:
            try:
                store.writer.sync()
            except OSError as exc:
                LOG.critical("the shared fdatasync of %d requests failed (%s): exiting without acknowledging "
                             "them; a restart replays what reached the disk", n, exc.strerror or exc)
                os._exit(EXIT_FSYNC_FAILED)
            store.unsynced = False

    def _send_all(self, replies: list[tuple[list[bytes], bytes]]) -> None:
        for envelope, data in replies:
            self._send(envelope, data)

    def _reply(self, envelope: list[bytes], reply: dict[str, Any]) -> None:
        self._send(envelope, wire.encode(reply))

    def _send(self, envelope: list[bytes], data: bytes) -> None:
        """Send without ever blocking the loop: a peer whose reply queue is full (it does not read)
        or that has gone loses this reply; a REQ client retries with the same request id anyway."""
        try:
            self.sock.send_multipart([*envelope, data], zmq.NOBLOCK)
        except zmq.ZMQError as exc:  # EAGAIN: the peer's queue is full; EHOSTUNREACH: the peer is gone
            if exc.errno not in (zmq.EAGAIN, zmq.EHOSTUNREACH):
                raise
            self.replies_dropped += 1
            if self.replies_dropped & (self.replies_dropped - 1) == 0:  # 1, 2, 4, 8 ...: never a log flood
                LOG.warning("dropped a reply to a peer that is gone or does not read its replies "
                            "(%d dropped so far)", self.replies_dropped)

    # ---------------------------------------------------------------- background snapshots
    def _start_split(self) -> None:
        """When the search index's queue is long (a start's replayed tail, an import's backlog): fork
        the child that indexes its first part (see SPLIT_MIN). Never beside a snapshot's child (whose
        install collects the segment files the index does not name yet) or a rebuild."""
        store = self.store
        if (self.stopping or len(store.unindexed) < SPLIT_MIN or store.rebuilding or self.rebuild_waiting
                or self.rebuild_outcome is not None or self.rebuild_reading is not None
                or time.monotonic() - self.split_failed < SPLIT_RETRY_S):
            return
        split = store.split_catch_up(SPLIT_SHARE)
        if split is None:
            return

        def work() -> int:  # in the child
            gc.disable()  # it builds its lists and exits: collections would only walk them
            store.write_split(split)
            return 0

        try:
            pid = children.start(work, delay_env="CONVMEM_FAULT_SPLIT_DELAY_S")
        except OSError as exc:
            LOG.warning("could not fork the search index's catch-up child (%s)", exc.strerror)
            store.finish_split(split, written=False)
            self.split_failed = time.monotonic()
            return
        self.split = (pid, split)
        LOG.info("search index catch-up: %d of %d queued messages indexed by a child (pid %d)",
                 len(split.seqs), len(store.unindexed), pid)

    def _take_index_check(self) -> None:
        """The outcome of the deferred CRC checks of the index segments the start mapped, once they are
        done (Store.index_check_step): on a failure the children working on the old index end first
        (the catch-up child's part is queued again, the snapshot child's plan dropped), then the store
        builds the index again (Store.discard_index). While a rebuild runs the outcome waits: the rebuilt
        index replaces this one (and no failure is reported for a segment it no longer maps)."""
        store = self.store
        if store.rebuilding:   # its index replaces this one; if it fails, the outcome is taken after it
            return
        reason = store.index_check_step()
        if reason is None:
            return
        if self.split is not None:
            self._reap_split(block=True)
        if self.snapshot_child is not None:
            self._reap_snapshot_child(block=True, kill=True)
        store.discard_index(reason)
        # as after a start that replayed the whole log: the loop and a catch-up child index the queue
        # (none failed: the one just ended was killed here), and background snapshots wait for them a while
        self.split_failed = -SPLIT_RETRY_S
        self._hold_snapshots_for_queue(store)

    def _hold_snapshots_for_queue(self, store: Store) -> None:
        """What the index's queue holds now was replayed (a start's tail, or every message after the index
        was dropped): remember its last message (0: none), and until when the background snapshots wait
        for the loop to index it (_background_snapshot)."""
        self.replayed_until = store.unindexed[-1] if store.unindexed else 0
        self.replay_wait_until = time.monotonic() + REPLAY_CATCH_UP_MAX_S

    def _reap_split(self, block: bool, wait_s: float = 0.0) -> None:
        """Install the catch-up child's segment once it has ended (``block``: waiting up to ``wait_s``,
        then ending it and queueing its part again)."""
        pid, split = self.split
        code = children.reap(pid, block=False)
        deadline = time.monotonic() + wait_s
        while code is None and block and time.monotonic() < deadline:
            time.sleep(0.01)
            code = children.reap(pid, block=False)
        if code is None:
            if not block:
                return
            code = children.reap(pid, block=True, kill=True)
            code = 1 if code == 0 else code   # killed: whatever it wrote is not trusted
        self.split = None
        t0 = time.monotonic()
        installed = self.store.finish_split(split, written=code == 0)
        if not installed:
            self.split_failed = time.monotonic()
        LOG.info("search index catch-up child ended (%s): %s", _exit_reason(code) if code else "exit code 0",
                 "its segment installed" if installed else "its messages queued again")
        self._note_slow(t0, lambda: "installing the catch-up child's segment")

    def _background_snapshot(self) -> None:
        if self.split is not None:   # the index has a hole until the child's segment is in
            return
        if self.snapshot_child is not None:
            self._reap_snapshot_child(block=False)
            return
        store = self.store
        if not self.snapshot_every_records or store.rebuilding or not (store.snapshot_due() or store.rebase_due()):
            return
        if self.snapshot_failures and time.monotonic() < self.snapshot_retry_at:
            return
        # A start's replayed tail is indexed by the loop before any snapshot: a child forked now would
        # index the same messages again on the other core, while the loop, indexing them too, would
        # copy on write every page it touches that the child still shares — a start after SIGKILL
        # served its first search seconds later for it. The snapshot follows as soon as they are indexed.
        if self.replayed_until:
            if (store.unindexed and store.unindexed[0] <= self.replayed_until
                    and time.monotonic() < self.replay_wait_until):
                return
            self.replayed_until = 0
        log_grew = (store.record_count - store.snapshot_records >= self.snapshot_every_records
                    or store.writer.size - max(store.snapshot_pos, 0) >= SNAPSHOT_EVERY_BYTES)
        # the snapshot on disk left many messages for the search index to catch up on (a replay or an
        # import queued them), and it has: the next start should find them indexed
        index_caught_up = not store.unindexed and store.snapshot_unindexed >= min(self.snapshot_every_records,
                                                                                   INDEXED_SINCE_SNAPSHOT)
        if not (log_grew or index_caught_up or store.search_flush_due() or store.base_due() or store.rebase_due()):
            return
        tmp = store.snapshot_path + layout.BACKGROUND_SUFFIX
        pos = store.writer.size
        # the index's live postings are frozen here: the child writes them as a segment, and the
        # loop reads the frozen lists until the snapshot naming that segment is installed
        # A long queue (an import's backlog) is not indexed by the child as well: the loop and the
        # catch-up children index it anyway, and under a bulk import, where snapshots run back to back,
        # the child's copy was most of each snapshot's time on the other core (~10k messages, 1-2 s, for
        # a start after a crash mid-import only). The snapshot leaves them queued; the one taken once
        # the index has caught up (index_caught_up) holds them.
        plan = store.plan_snapshot(catch_up=len(store.unindexed) < SPLIT_MIN)

        def work() -> int:  # in the child: write the frozen image
            store.write_snapshot_file(tmp, plan)
            # put in place here, not by the loop: the directory's fsync waits for the disk (0.3 s
            # when another process writes a lot), and a child killed before this left only a tmp.
            # The parent kills a running child before a rebuild, so this never lands on a rebuilt log.
            # The old snapshot is cut away a piece at a time after the rename, not freed in it: that
            # held the journal, and the loop's commits with it (fileio.RELEASE_STEP_BYTES).
            old = store.io.open_to_release(store.snapshot_path)
            store.io.replace(tmp, store.snapshot_path)
            store.io.sync_dir(store.dir)
            if old is not None:
                release_now(old)
            return 0

        try:
            pid = children.start(work, delay_env="CONVMEM_FAULT_SNAPSHOT_DELAY_S")
        except OSError as exc:
            LOG.warning("could not fork a background snapshot (%s); will retry later", exc.strerror)
            store.abandon_snapshot(plan)
            store.snapshot_records = store.record_count  # do not retry at every request
            store.snapshot_unindexed = 0
            return
        self.snapshot_child = (pid, pos, time.monotonic(), plan)
        # counted as taken now, so that a failing child is not started again at every request
        store.snapshot_records = store.record_count
        store.snapshot_unindexed = 0 if plan.catchup_name is not None else len(store.unindexed)
        LOG.info("background snapshot started (pid %d, log position %d)", pid, pos)

    def _snapshot_failed(self) -> None:
        self.snapshot_failures += 1
        wait = min(SNAPSHOT_RETRY_MAX_S, SNAPSHOT_RETRY_S * 2 ** (self.snapshot_failures - 1))
        self.snapshot_retry_at = time.monotonic() + wait
        LOG.warning("background snapshot: %d failed in a row, the next one in %.0f s", self.snapshot_failures, wait)

    def _reap_snapshot_child(self, block: bool, kill: bool = False) -> None:
        pid, pos, started, plan = self.snapshot_child
        code = children.reap(pid, block, kill=kill or time.monotonic() - started > SNAPSHOT_CHILD_MAX_S)
        if code is None:
            return
        self.snapshot_child = None
        tmp = self.store.snapshot_path + layout.BACKGROUND_SUFFIX
        if code == 0 and not kill and not self.store.rebuilding:
            try:
                self.store.install_snapshot(None, pos, plan, background=True)  # in place: the child
                LOG.info("background snapshot installed in %.2f s (log position %d)",
                         time.monotonic() - started, pos)
                self.snapshot_failures = 0
                return
            except OSError as exc:
                LOG.warning("could not install the background snapshot: %s", exc.strerror)
                self._snapshot_failed()
        elif not kill:
            LOG.warning("background snapshot child failed (exit code %d)", code)
            self._snapshot_failed()
        self.store.abandon_snapshot(plan)
        self.store.io.remove(tmp)

    def handle(self, frames: list[bytes], envelope: list[bytes] | None = None) -> dict[str, Any] | None:
        """Any bytes in, one reply out, in the family of the op asked for. Never raises. With the
        requester's ``envelope``, an ``import_messages`` becomes an import in progress (``imports``)
        whose reply the loop sends when its last slice is stored: None then."""
        op = None
        try:
            if len(frames) != 1:
                raise E.invalid("request must be a single frame")
            op, raw_args, rid, context = wire.decode_envelope(frames[0])
            if op == "import_messages" and envelope is not None and self.store is not None:
                # A retry (same request id: a client that timed out and sent it again) gets the first
                # one's reply, its counts included, not "imported 0, existing N" of a second import
                if rid in self.import_results:
                    return self.import_results[rid]
                for envelopes, running, _ in self.imports:
                    if running == rid:
                        if len(envelopes) >= IMPORTS_MAX:  # a client repeating itself: bounded as imports are
                            raise ProtocolError(E.BUSY, "this import is in progress; retry shortly",
                                                retry_after_ms=L.BUSY_RETRY_AFTER_MS)
                        envelopes.append(envelope)  # answered with it when it is stored
                        return None
                if self.rebuild_waiting:
                    raise ProtocolError(E.BUSY, "rebuild_index starts once the imports in progress are done; "
                                                "retry shortly", retry_after_ms=L.BUSY_RETRY_AFTER_MS)
                if len(self.imports) >= IMPORTS_MAX:
                    raise ProtocolError(E.BUSY, f"{len(self.imports)} imports are in progress; retry shortly",
                                        retry_after_ms=L.BUSY_RETRY_AFTER_MS)
                self.imports.append(([envelope], rid, self._import_steps(raw_args, rid)))
                return None
            args = wire.validate_args(op, raw_args, context)
            if self.store is None:
                return self._loading_reply(op)
            t0 = time.monotonic()
            try:
                return self.handlers[op](args, rid)
            finally:
                took = time.monotonic() - t0
                if took > self._slowest_op[1]:
                    self._slowest_op = (op, took)
        except Exception as exc:
            return self._failure(op, exc)

    @staticmethod
    def _failure(op: str | None, exc: Exception) -> dict[str, Any]:
        """The reply to a request that raised ``exc``: a contract error, whatever went wrong."""
        if isinstance(exc, HistoryError):
            return exc.reply()
        if isinstance(exc, ProtocolError):
            reply = exc.reply()
            return H.from_memory_error(reply) if op in H.HISTORY_TOOLS else reply
        if isinstance(exc, TextDamaged):  # the store is marked damaged (health DEGRADED); this read fails
            reply = error_reply(E.CORRUPT_STORE, "a message's record in the log is damaged; run "
                                                 "`convmem-storaged --salvage` to repair the log")
        elif isinstance(exc, OSError):  # text is read from the log: a failing disk fails the read, not the daemon
            LOG.error("I/O error while handling a request: %s", exc)
            reply = error_reply(E.IO_ERROR, f"the store could not read the log ({exc.strerror or exc})")
        elif isinstance(exc, MemoryError):
            LOG.error("out of memory while handling a request")
            reply = error_reply(E.INTERNAL_ERROR, "the daemon ran out of memory for this request")
        else:
            LOG.error("internal error while handling a request:\n%s",
                      "".join(traceback.format_exception(type(exc), exc, exc.__traceback__)))
            reply = error_reply(E.INTERNAL_ERROR, "internal error in the storage daemon (see its log)")
        return H.from_memory_error(reply) if op in H.HISTORY_TOOLS else reply

    # ---------------------------------------------------------------- imports in slices
    def _import_steps(self, raw_args: Any, rid: str | None) -> Generator[None, None, dict[str, Any]]:
        """An import: validated a message at a time, then stored a slice at a time (``Store.import_steps``)."""
        req = yield from V.import_messages_steps(raw_args)
        return (yield from self.store.import_steps(req, rid))

    def _import_slice(self, budget_s: float | None) -> None:
        """Advance the oldest import in progress for about ``budget_s`` (None: to its end); reply to it
        once it is done. Imports go one after another, in the order they came."""
        envelopes, rid, steps = self.imports[0]
        deadline = None if budget_s is None else time.monotonic() + budget_s
        try:
            while True:
                next(steps)
                if deadline is not None and time.monotonic() > deadline:
                    return
        except StopIteration as done:
            reply = done.value
        except Exception as exc:
            reply = self._failure("import_messages", exc)
        self.imports.popleft()
        if reply.get("status") == "OK":  # a failed one is tried again by a retry
            _remember(self.import_results, rid, reply, IMPORT_RESULTS_KEPT)
        for envelope in envelopes:
            self._reply(envelope, reply)

    def _loading_reply(self, op: str) -> dict[str, Any]:
        if op == "ping":
            return {"status": "OK", "pid": os.getpid(), "rebuilding": False, "loading": True, **self.identity}
        if op in H.HISTORY_TOOLS:
            reply = H.refresh_error().reply()
        else:
            reply = error_reply(E.BUSY, "the storage daemon is still loading its store; retry shortly",
                                retry_after_ms=H.REFRESH_RETRY_AFTER_MS)
        reply[wire.LOADING_KEY] = True  # for clients that wait a load out (front-ends drop the key)
        return reply

    def stop(self, *_: Any) -> None:
        self.stopping = True

    # ---------------------------------------------------------------- small ops
    def _ping(self, args: R.Ping, rid: str) -> dict[str, Any]:
        return {"status": "OK", "pid": os.getpid(), "rebuilding": self.store.rebuilding, "loading": False,
                **self.identity}

    def _ingest_heartbeat(self, args: R.IngestHeartbeat, rid: str) -> dict[str, Any]:
        self.store.ingest.heartbeat(args)
        return {"status": "OK"}

    def _health(self, args: R.GetSystemHealth, rid: str) -> dict[str, Any]:
        health = self.store.health()
        health["rebuilding"] = self.store.rebuilding
        return health

    # ---------------------------------------------------------------- rebuild beside the loop
    def _rebuild_index(self, args: R.RebuildIndex, rid: str) -> dict[str, Any]:
        kept = self.rebuild_results.get(rid)
        if kept is not None:
            if not (E.is_error_reply(kept) and kept["error"]["code"] in E.RETRYABLE):
                return kept
            # it ended BUSY (its worker could not be forked): the same request sent again starts it again
            del self.rebuild_results[rid]
        if self.store.rebuilding or self.rebuild_waiting:
            if rid == self.rebuild_id:
                return self._rebuilding_reply()
            raise ProtocolError(E.BUSY, "another rebuild_index is running; retry shortly",
                                retry_after_ms=L.BUSY_RETRY_AFTER_MS)
        if self.split is not None:
            raise ProtocolError(E.BUSY, "the search index is catching up (a child indexes part of it); retry shortly",
                                retry_after_ms=L.BUSY_RETRY_AFTER_MS)
        self.store._check_writable()
        self.rebuild_id = rid
        if self.imports:
            # a rebuild refuses mutations: the imports in progress are finished first (_serve starts it
            # then); new ones are answered BUSY meanwhile, so that a steady ingester cannot hold it off
            self.rebuild_waiting = True
            LOG.info("rebuild %s waits for %d import(s) in progress", rid, len(self.imports))
        else:
            self._start_rebuild()
        if rid in self.rebuild_results:  # the worker could not be started
            return self.rebuild_results.pop(rid)
        return self._rebuilding_reply()

    def _start_rebuild(self) -> None:
        """Fork the rebuild's worker (compaction.run_child). It sees the state as it is now, which
        stays so until the install: mutations are answered BUSY meanwhile. Its tokenising runs on a
        core of its own, never taking the loop's GIL (a worker thread did, and every request waited
        behind it); the loop only checks, between requests, whether it has exited."""
        store = self.store
        # an earlier rebuild's move ends first: once it ends, the log it moves off is cut away
        # (FileIO.release_fd), and a worker forked before that would read its texts from the cut file
        store.relocate_step(None)
        if self.snapshot_child is not None:
            self._reap_snapshot_child(block=True, kill=True)  # the rebuild writes a fresh one anyway
        if self.split is not None:   # (a rebuild asked for while imports ran: it starts once they end)
            self._reap_split(block=True)   # ended now, its messages queued again: the rebuild indexes them all
        compaction.discard(store)  # an earlier worker's leftovers are never taken for this one's
        short = compaction.space_shortfall(store)
        if short is not None:
            LOG.warning("rebuild %s refused: %s", self.rebuild_id, short)
            self._keep_rebuild_result(self.rebuild_id, error_reply(E.IO_ERROR, short))
            self.rebuild_id = None
            return
        store.rebuilding = True

        def work() -> int:  # in the child
            gc.disable()  # it builds millions of objects and exits: collections would only walk them
            return compaction.run_child(store)

        self.rebuild_started = time.monotonic()
        try:
            self.rebuild_child = children.start(work, delay_env="CONVMEM_FAULT_REBUILD_DELAY_S")
        except OSError as exc:
            store.rebuilding = False
            LOG.warning("could not fork the rebuild's worker (%s)", exc.strerror)
            self._keep_rebuild_result(self.rebuild_id, error_reply(
                E.BUSY, f"rebuild could not start its worker ({exc.strerror}); retry later", retry_after_ms=1000))
            self.rebuild_id = None
            return
        LOG.info("rebuild %s started (worker pid %d, %d messages, log %d bytes)", self.rebuild_id,
                 self.rebuild_child, len(store.by_id), store.log_size())

    def _start_waiting_rebuild(self) -> None:
        """The rebuild asked for while imports were in progress, once the last is done."""
        self.rebuild_waiting = False
        try:
            self.store._check_writable()  # the store may have become damaged or broken meanwhile
        except ProtocolError as exc:
            self._keep_rebuild_result(self.rebuild_id, exc.reply())
            self.rebuild_id = None
            return
        self._start_rebuild()

    def _keep_rebuild_result(self, rid: str, reply: dict[str, Any]) -> None:
        _remember(self.rebuild_results, rid, reply, REBUILD_RESULTS_KEPT)

    def _rebuilding_reply(self) -> dict[str, Any]:
        return {"status": wire.REBUILDING, "rebuild_id": self.rebuild_id, "retry_after_ms": 50}

    def _rebuild_exited(self, code: int | None) -> None:
        """The worker has exited with ``code`` (None: killed by a stop): start reading what it left."""
        self.rebuild_child = None
        if code is None:
            self.rebuild_outcome = ("cancelled", None)
        elif code != 0:
            self.rebuild_outcome = ("error", error_reply(
                E.INTERNAL_ERROR, f"rebuild's worker ended without a result ({_exit_reason(code)}); "
                                  f"the store is unchanged"))
        else:
            self.rebuild_reading = compaction.read_result_steps(self.store)
            self._read_rebuild_step()

    def _read_rebuild_step(self) -> None:
        """One step of reading the worker's result (one per turn of the loop). No collection meanwhile:
        it would walk the objects the result is made of (16 ms at 275k messages); they are frozen
        after the next full collection (``_on_collection``)."""
        gc.disable()
        try:
            next(self.rebuild_reading)
            self.rebuild_step_at = R.paused_at(self.rebuild_reading)
            return
        except StopIteration as done:
            self.rebuild_step_at = "its end"
            self.rebuild_outcome = done.value
        except Exception as exc:  # a result that cannot be read or a segment that cannot be mapped
            LOG.error("rebuild's result could not be read:\n%s", traceback.format_exc())
            self.rebuild_outcome = ("error", error_reply(
                E.INTERNAL_ERROR, f"rebuild's result could not be read ({type(exc).__name__}); "
                                  f"the store is unchanged"))
        finally:
            gc.enable()
        self.rebuild_reading = None

    def _finish_rebuild(self) -> None:
        """Install what the worker left (``rebuild_outcome``), or report why there is nothing to."""
        kind, value = self.rebuild_outcome
        self.rebuild_outcome = None
        store = self.store
        rid = self.rebuild_id
        if kind == "ok":
            gc.disable()
            try:
                reply = compaction.install(store, value, background=True)
            except OSError as exc:
                store.last_error = f"rebuild could not install its files ({exc.strerror or exc})"
                reply = error_reply(E.IO_ERROR, "rebuild could not install its files; restart the daemon")
                store.broken = store.last_error
            finally:
                gc.enable()
            LOG.info("rebuild %s finished in %.2f s: %s", rid, time.monotonic() - self.rebuild_started, reply)
        else:
            reply = value if kind == "error" else error_reply(E.BUSY, "rebuild was cancelled by a shutdown",
                                                               retry_after_ms=1000)
            LOG.warning("rebuild %s did not complete: %s", rid, reply)
        compaction.discard(store)  # the result file, and a failed worker's temps
        store.rebuilding = False
        self.rebuild_id = None
        if rid is not None:
            self._keep_rebuild_result(rid, reply)

    def _rebuild_status(self, args: R.RebuildStatus, rid: str) -> dict[str, Any]:
        wanted = args.rebuild_id
        if (self.store.rebuilding or self.rebuild_waiting) and wanted == self.rebuild_id:
            return self._rebuilding_reply()
        if wanted in self.rebuild_results:
            return self.rebuild_results[wanted]
        raise ProtocolError(E.NOT_FOUND, "no rebuild with this rebuild_id is known (the daemon may have restarted)")

    def cancel_rebuild(self) -> None:
        if self.rebuild_child is not None:
            children.reap(self.rebuild_child, block=True, kill=True)
            self._rebuild_exited(None)
        if self.rebuild_reading is not None:
            self.rebuild_reading = None
            self.rebuild_outcome = ("cancelled", None)
        if self.rebuild_outcome is not None:
            if self.rebuild_outcome[0] == "ok":  # read but not installed: the stop comes first
                self.rebuild_outcome = ("cancelled", None)
            self._finish_rebuild()

    def close(self) -> None:
        if self.loader is not None:  # stopped while loading: let the open finish (it may be cutting a torn tail)
            self.loader.join()
            if self.load_outcome and self.load_outcome[0] == "ok":
                self.install_store(self.load_outcome[1])
            self.loader = None
        if self.snapshot_child is not None:
            self._reap_snapshot_child(block=True, kill=True)
        if self.split is not None:
            self._reap_split(block=True, wait_s=SPLIT_STOP_WAIT_S)
        self.cancel_rebuild()
        self.sock.close(linger=0)
        self.wake_recv.close(linger=0)
        if self.authenticator is not None:
            self.authenticator.stop()
            self.authenticator = None


def split_envelope(frames: list[bytes]) -> tuple[list[bytes] | None, list[bytes]]:
    """(routing frames up to and including the empty delimiter, request frames); (None, []) without one."""
    for i in range(1, len(frames)):
        if not frames[i]:
            return frames[:i + 1], frames[i + 1:]
    return None, []


def install_signal_handlers(server: Server) -> None:
    signal.signal(signal.SIGTERM, server.stop)
    signal.signal(signal.SIGINT, server.stop)
