"""The store: the in-memory state, its recovery from disk, and every mutation.

A state change is first appended to the log, then applied in memory; no reply tells of it before
it is on disk (each append is fsync'ed, or a group-committed batch shares one fdatasync before its
replies leave, ``storaged/server.py``). One path applies records: replay at start applies each
record read from the log through ``_apply``, and a live mutation (``write_message``,
``update_message``, ``delete_message``, ``import_messages``) builds its records, appends them
(``_commit``) and applies them through the same ``_apply`` — so what a reply said and what a
restart finds agree by construction. A snapshot's messages load through ``_bulk_load``; a
compaction swaps in a whole new state (``storaged/compaction.py``).

Message text is not kept in memory: ``_apply`` records where each text lies in the log
(``storaged/text.py``) and reads go back to the log for it.

Besides messages (record kinds w/u/d) the log holds the history interface's session metadata
("s": merged into what the session had), transcript ingesters' read positions ("k"), each written
in the same append as the events they describe, and a compacted log's checkpoint ("c": sequence,
clock and request-id window).
"""
from __future__ import annotations

import functools
import logging
import os
import sys
import threading
import time
from collections import OrderedDict, deque
from typing import Any, Callable, Generator, Iterable, NamedTuple, Sequence

import numpy as np

from protocol import errors as E
from protocol import limits as L
from protocol import requests as R
from protocol.errors import ProtocolError

from . import layout
from . import log as logfile
from . import records
from . import snapshot
from .columns import ETYPE_CODE, MessageTable, RebaseMismatch
from .fileio import DROP_WINDOW_PAGES, FileIO, drop_pages, page_count
from .handles import session_digest
from .idgen import IdClock, ulid_ms
from .indexes import IndexSizes, RelationIndex, Session, SessionKeys, SessionMap, TouchIndex, sessions_from_table
from .ingeststate import IngestState
from .model import Message, message_from_args
from .packedmap import PackedMap, is_packed_map
from .search import DumpOutdated, SearchIndex, SegmentPlan
from .segment import DEFERRED, Segment, SegmentCheck, is_segment_name, new_name as new_segment_name
from .sessionorder import SessionOrder
from .text import LogText, locate

# the session metadata that filters read for every session (PackedMap.hot): no unpacking in a scan
SESSION_HOT_FIELDS = ("harness", "source", "mode")
# the pages of a mapping release_pages_while lets go at a time (1 MiB): what a request that arrives
# meanwhile may wait behind (~25 µs with every page resident; 16 MiB windows, 0.4 ms, cost a 5M query
# mix back to back ~1 ms of its p50)
CAP_WINDOW_PAGES = 256

LOG = logging.getLogger("convmem.storaged")

CURSOR_KEY_BYTES = 32  # the HMAC key of cursors and typed ids (storaged/cursor.py, handles.py)
# Request ids remembered for exactly-once retries: at most this many, and none older than
# L.REQUEST_ID_RETENTION_S. A retry comes seconds after its original, so this is generous; the
# window is kept durably (log records, snapshot, the compacted log's checkpoint record). The time of
# a request id is when the daemon saw it (the time of the record it names), never the time a client
# wrote into the ULID: a client could send any, and one dated 9999 would then be kept for ever.
RID_WINDOW = 16384
# An import is stored in slices of at most this many messages or this much text (import_steps): one
# slice is ~5-10 ms of the request loop and one fdatasync, so no other client waits behind a whole
# batch of a thousand (0.1-1 s at once).
IMPORT_SLICE_MESSAGES = 64
IMPORT_SLICE_BYTES = 1 << 20


def _remove_all(io: FileIO, paths: list[str], release: bool = False, mapped: frozenset[str] = frozenset()) -> None:
    """Remove segment files no longer named (``release``: their blocks freed a cut at a time by a
    thread, FileIO.release — but for those ``mapped``: a mapping of a cut file faults when read, so
    they are only unlinked, their blocks freed when the mapping goes); one that cannot be removed stays
    an orphan, which the next collection (or start) tries again."""
    for path in paths:
        try:
            (io.release if release and os.path.basename(path) not in mapped else io.remove)(path)
        except OSError as exc:
            LOG.warning("could not remove the unused index segment %s (%s)", path, exc.strerror or exc)


class _Relocation:
    """Messages moving to a compacted log (Store.relocate_step): the message at seq ``seqs[i]`` goes
    to ``locs[i]`` in a record of ``rec_sizes[i]`` bytes; the first ``done`` have moved. Seqs, not
    the Message objects: a list of 275k of them took 30 ms of the loop to make (each object's
    refcount touched, cold), and the seqs come from the rebuild's worker as bytes."""

    __slots__ = ("old", "seqs", "rec_sizes", "locs", "done", "old_fd")

    def __init__(self, old: LogText, seqs: Sequence[int], rec_sizes: Sequence[int], locs: Sequence[int],
                 old_fd: int | None) -> None:
        self.old, self.seqs, self.rec_sizes, self.locs, self.done = old, seqs, rec_sizes, locs, 0
        self.old_fd = old_fd  # the old log open for writing: to free its blocks a cut at a time


def check_revision(msg: Message, expected: int | None) -> None:
    """The CONFLICT rule of update_message and of the content view: an ``expected_revision``, when
    given, must be the message's current revision."""
    if expected is not None and expected != msg.revision:
        raise ProtocolError(E.CONFLICT, "expected_revision does not match the message's current revision")


# A snapshot writes a base of every row instead of one more delta when this many row segments are in
# use already (so at most this many are), or when the deltas' rows and dead seqs would pass half the
# base's rows (and this many)
ROW_SEGMENTS_MAX = 8
ROW_DELTA_MIN = 1024


class SplitCatchUp(NamedTuple):
    """The part of the search index's queue a forked child indexes (Store.split_catch_up): its seqs,
    in the slots from ``slot_lo`` the index reserved for them, and the segment file it writes."""
    seqs: list[int]
    slot_lo: int
    name: str


class SnapshotPlan(NamedTuple):
    """What a snapshot writes (Store.plan_snapshot): the index segment and the index's segment names
    after it, the row segment (None: the rows did not change), whether it is a base (every row) or
    a delta (the rows of ``rows_seqs``, and ``rows_dead``), the row segments the manifest names,
    the changed seqs it took from the store (given back by ``abandon_snapshot``), and the name of the
    index segment a background child writes of the messages still queued for the index (None: none
    queued, or an inline snapshot)."""
    index: SegmentPlan | None
    index_names: list[str]
    rows_name: str | None
    rows_base: bool
    rows_seqs: list[int]
    rows_dead: list[int]
    rows_after: list[list[Any]]
    changed: set[int]
    deleted: set[int]
    catchup_name: str | None = None
    metas: set[str] = set()                     # a delta's session metadata and checkpoints (a base: all)
    checkpoints: set[tuple[str, str]] = set()
    # a base written in the table's own numbering: its live seqs' (first, end), which a background
    # snapshot's installer maps in place of the rows (MessageTable.rebase_open); None: renumbered
    rebase: tuple[int, int] | None = None


class Store:
    def __init__(self, data_dir: str, io: FileIO | None = None) -> None:
        self.dir = os.path.abspath(data_dir)
        self.io = io or FileIO()
        self.log_path = os.path.join(self.dir, layout.LOG)
        self.snapshot_path = os.path.join(self.dir, layout.SNAPSHOT)
        # state
        # the live messages' fields as columns (storaged/columns.py); by_id and by_seq are read-only
        # mappings over them that build a Message for each lookup
        self.table = MessageTable()
        self.by_id = self.table.by_id
        self.by_seq = self.table.by_seq
        self.sessions: dict[str, Session] = SessionMap()   # (a start's made on first use: SessionMap)
        # history interface: session metadata (harness, source, title, cwd, project...) by session id,
        # and the log bytes of the "s" records it was merged from; ingesters' checkpoints and heartbeats
        self.session_meta = PackedMap(SESSION_HOT_FIELDS)   # sid -> its metadata, packed
        self.meta_rec_sizes: dict[str, int] = {}
        self.meta_bytes = 0                # sum of meta_rec_sizes
        self.ingest = IngestState()
        # bumped whenever a session appears, disappears or gets a new first/last event time (the
        # history views cache their orderings against it)
        self.sessions_version = 0
        self.session_keys = SessionKeys()  # handles.session_digest(sid) -> sid, for session: ids
        self.relations = RelationIndex()
        self.touches = TouchIndex()
        # The search index lags the state by the messages in ``unindexed`` (seqs, oldest first): a
        # mutation or replay only queues its message, and the daemon indexes the queue in slices between
        # requests (``index_step``), so a big import or a replay never holds every client behind its
        # indexing. Whoever searches reads ``search``, which first indexes whatever is still queued.
        self._index = SearchIndex()
        self._pages_next = 0   # the step of release_pages_step's round that comes next
        self._cap_at = (0, 0)  # where release_pages_while goes on: (which mapping, its page)
        self.unindexed: deque[int] = deque()
        # the deferred CRC checks of the index segments the start mapped (segment.SegmentCheck), until
        # index_check_step has taken their outcome; what discard_index said, until the index is whole again
        self.index_check = None
        self.index_damage: str | None = None
        # imports are refused BUSY while this many messages wait for the index (index_backlog; the daemon
        # sets it; None: no limit), so a bulk import goes at the indexing's pace and the index is never far behind
        self.index_queue_max: int | None = None
        # message text is read back from the log by position; a record found damaged then is damage
        self.log_text = LogText(self.io, on_damage=self._text_damaged)
        self.clock = IdClock()
        # request id -> (op, message id, revision, ms the daemon saw it), oldest first
        self.rids: OrderedDict[str, tuple[str, str, int, int]] = OrderedDict()
        self.last_seq = 0
        # log accounting (the current log file only)
        self.update_records = 0
        self.deleted_messages = 0
        self.record_count = 0
        self.live_bytes = 0
        self.relocation: _Relocation | None = None  # messages moving to a compacted log (relocate_step)
        self.checkpoint_bytes = 0
        # memory accounting, maintained on insert/remove
        self.body_bytes = 0
        # health
        self.recovered_tail = False
        self.snapshot_valid = True
        self.last_error = ""
        # last_error of an append that failed but was fully undone: the next durable append clears it
        self.transient_error: str | None = None
        self.corrupt: str | None = None   # mutations refused with CORRUPT_STORE while set
        self.broken: str | None = None    # mutations refused with IO_ERROR while set
        self.rebuilding = False
        self.writer: logfile.LogWriter | None = None
        self.salt = b""
        self.snapshot_pos = -1            # log size the snapshot on disk covers (-1: none for this log)
        self.cursor_key = b""
        self.session_order = SessionOrder()   # the sessions view's order, and its recent moves
        self.scan_result = logfile.ScanResult()
        self.salvaging = False
        self.snapshot_records = 0         # record_count when the snapshot on disk was taken
        self.snapshot_unindexed = 0       # messages it left queued for the search index (see unindexed)
        self.snapshot_outdated = False    # the snapshot on disk is of an earlier format (see _migrate)
        # the index segment files the snapshot on disk names; None while unknown (a snapshot that was
        # not read: a salvage, or one ignored for a reason that may pass) — then none is ever removed
        self.snapshot_segments: list[str] | None = None
        # The row segments the snapshot on disk names ([[name, rows, dead], ...], oldest first; snapshot.py),
        # None while no base of the current rows is known to be on disk (none read, a salvage, a
        # snapshot with its rows inline): the next snapshot then writes a base. ``rows_changed``:
        # the seqs written or replaced since the last snapshot was planned, ``rows_deleted``: those
        # deleted since — what the next delta holds.
        self.row_segments: list[list[Any]] | None = None
        self.rows_changed: set[int] = set()
        self.rows_deleted: set[int] = set()
        # the sessions whose metadata and the checkpoints that changed since then (in a delta's tail too)
        self.metas_changed: set[str] = set()
        self.checkpoints_changed: set[tuple[str, str]] = set()
        # whether they are kept: not while the next snapshot writes a base anyway (a full replay of
        # millions of messages would fill them for nothing), from the first plan or loaded row segments on
        self.rows_tracked = False
        # the row segments on disk include one of an earlier version, or a tail without the sessions' hot
        # fields, or a base of live rows with a gap before or between them: the next snapshot writes a base
        # of the current version, lying as the rows do (which a start maps)
        self.rows_legacy = False
        # a compaction's relocation rewrote every row (on the heap since), and a base of them can be mapped
        # in their place (decided once, as it ends): the next background snapshot writes one (``rebase_due``;
        # a stop's does not: it would rewrite every row the rebuild's base already holds, and map nothing)
        self.rows_relocated = False
        # Group commit (set by the server for a batch of requests): appends skip their fdatasync and
        # the server syncs once before it sends any reply of the batch.
        self.group_commit = False
        self.unsynced = False

    # ------------------------------------------------------------------ opening and recovery
    @classmethod
    def open(cls, data_dir: str, io: FileIO | None = None, salvage: bool = False) -> "Store":
        store = cls(data_dir, io)
        store._recover(salvage)
        return store

    def _recover(self, salvage: bool) -> None:
        self.salvaging = salvage
        io = self.io
        os.makedirs(self.dir, mode=0o700, exist_ok=True)
        for leftover in layout.leftovers(self.dir):
            LOG.info("removing leftover %s of an interrupted write", os.path.basename(leftover))
            io.remove(leftover)
        self._load_cursor_key()
        if not io.exists(self.log_path) and io.exists(self.snapshot_path):
            # The log is the source of truth; starting empty here would hide a lost file.
            self._set_corrupt("the log file is missing although a snapshot exists; restore the log "
                              "from a backup (nothing was changed)")
            return
        if not io.exists(self.log_path):
            self.writer = logfile.LogWriter.create(io, self.log_path)
            self.log_text.open(self.log_path, self.writer.salt)
            self.salt = self.writer.salt
            self.record_count = 0
            return
        buf = io.read_all(self.log_path)
        try:
            self._replay(buf, salvage)
        finally:
            if hasattr(buf, "close"):
                buf.close()
        self.release_pages()

    def release_pages(self) -> int:
        """Let the process's resident pages of the table's and the index's file mappings go, where they
        are the files' own (the page cache keeps them: a later read maps them back without the disk).
        Why: a start reads every row and every slot's tables through them once — at five million events
        ~0.6 GB the kernel counted as the daemon's memory until the process ended — while a query reads
        a few rows and the parts of the lists it searches. Bytes advised."""
        return self.table.release_pages() + self._index.release_pages()   # (not .search: it indexes the queue)

    def _release_spans(self) -> list[tuple[Callable[[int, int], int], int]]:
        """The mappings ``release_pages`` lets go (the segments' and the table's), each as (what lets its
        pages ``first`` to ``first + count`` go, its page count), those with any pages. Looked up afresh
        at each call (a merge may have replaced a segment)."""
        spans = list(self._index.segment_releasers())
        spans += [(functools.partial(drop_pages, mm, private), page_count(mm)) for mm, private in self.table.mappings()]
        return [(release, pages) for release, pages in spans if pages]

    def _release_units(self) -> list[Callable[[], int]]:
        """What ``release_pages`` does, in steps of at most DROP_WINDOW_PAGES pages of one mapping: each a
        few ms at most at 5M events, where a whole segment of a GB of resident pages took tens."""
        return [functools.partial(release, at, DROP_WINDOW_PAGES)
                for release, pages in self._release_spans() for at in range(0, pages, DROP_WINDOW_PAGES)]

    def release_pages_step(self) -> bool:
        """One step of ``release_pages`` while the daemon rests (``_release_units``). Why: a query mix
        reads ~2 GB of a 5M store's postings through the segments' mappings, which the kernel then
        counts as the daemon's until something lets them go. False once a round has ended (the next
        call starts another; ``release_pages_restart`` after a request starts the round over)."""
        units = self._release_units()
        step = self._pages_next
        if step < len(units):
            units[step]()
        self._pages_next = step + 1 if step + 1 < len(units) else 0
        return self._pages_next != 0

    def release_pages_while(self, more: Callable[[], bool], deadline: float) -> bool:
        """Windows of CAP_WINDOW_PAGES of the mappings ``release_pages`` lets go, while ``more()`` and the
        clock is before ``deadline``, going on from where the last call stopped (its own round, which
        requests do not restart: it runs while they come). Why: a burst of queries that never leaves
        the daemon at rest maps GBs of postings (3.5 GB at 5M events); the request loop keeps what
        they map under a cap with this, in the gaps between requests — a window small enough (~25 µs
        when every page of it is resident) that a request arriving meanwhile hardly waits. True if
        the deadline or ``more()`` stopped it; False once it has done a whole round (nothing more to
        let go now)."""
        spans = self._release_spans()
        if not spans:
            return False
        i, at = self._cap_at
        if i >= len(spans) or at >= spans[i][1]:
            i, at = 0, 0
        try:
            for _ in range(sum(-(-pages // CAP_WINDOW_PAGES) for _, pages in spans)):
                if not more():
                    return True
                release, pages = spans[i]
                release(at, CAP_WINDOW_PAGES)
                at += CAP_WINDOW_PAGES
                if at >= pages:
                    i, at = (i + 1) % len(spans), 0
                if time.monotonic() >= deadline:
                    return True
            return False
        finally:
            self._cap_at = (i, at)

    def release_pages_restart(self) -> None:
        """The next release_pages_step starts a round from its first step (a request may have read
        what the round already let go)."""
        self._pages_next = 0

    def _load_cursor_key(self) -> None:
        path = os.path.join(self.dir, layout.CURSOR_KEY)
        if self.io.exists(path):
            key = bytes(self.io.read_all(path))
            if len(key) == CURSOR_KEY_BYTES:
                self.cursor_key = key
                return
        self.cursor_key = os.urandom(CURSOR_KEY_BYTES)
        self.io.write_file_atomic(path, self.cursor_key)

    def _replay(self, buf, salvage: bool) -> None:
        try:
            salt = logfile.parse_header(buf)
        except logfile.LogCorrupt as exc:
            self._set_corrupt(f"{exc}; bytes 0-{min(len(buf), logfile.HEADER_SIZE)} of the log; nothing could be read")
            return
        self.salt = salt
        self.log_text.open(self.log_path, salt)
        start = logfile.HEADER_SIZE
        if not self.io.exists(self.snapshot_path):
            self.snapshot_segments = []  # no snapshot names any segment
        elif not salvage:  # a salvage checks every record
            start = self._load_snapshot(salt, len(buf))
        result = self.scan_result = logfile.ScanResult()
        for pos, size, record in logfile.scan(buf, salt, start, result, resync=salvage):
            self._apply(record, pos, size)
        end = result.end
        if result.damage is not None and not salvage:
            a, b = result.damage
            self._set_corrupt(
                f"log damaged at bytes {a}-{b} (of {len(buf)}); serving the {result.records} records before it; "
                f"mutations are refused until `convmem-storaged --salvage` repairs the log")
            LOG.error("%s", self.last_error)
            return
        if result.torn_tail and not salvage:
            LOG.warning("cutting off a torn record at the end of the log (bytes %d-%d)", end, len(buf))
            fd = self.io.open_append(self.log_path, create=False)
            try:
                self.io.truncate(fd, end)
                self.io.sync(fd)
            finally:
                self.io.close(fd)
            self.recovered_tail = True
        if self.clock.rejected:
            LOG.warning("%d stored ids or times lie more than %d h beyond the wall clock; they are kept as they "
                        "are, but new writes take their times from the wall clock", self.clock.rejected,
                        L.CLOCK_SKEW_MAX_MS // 3_600_000)
        if salvage:
            return
        self.writer = logfile.LogWriter(self.io, self.log_path, salt, end)
        # What was just replayed may be only in the page cache: a daemon that exited after a failed shared
        # fdatasync (EXIT_FSYNC_FAILED) left its batch there unsynced, and its clients' retries are about
        # to be answered "already applied" from it. Make it durable before anything is acknowledged.
        try:
            self.writer.sync()
        except OSError as exc:
            self.broken = self.last_error = (f"the log could not be flushed at start ({exc.strerror or exc}); "
                                             f"writes are refused until a restart succeeds")
            LOG.error("%s", self.last_error)
            return
        self.collect_segments()  # a crash's orphans, a merge's inputs whose removal a crash interrupted
        if self.snapshot_outdated:
            self._migrate_snapshot()

    def _migrate_snapshot(self) -> None:
        """Replace a snapshot of an earlier format by one of the current format, once, at the first
        start of a new release: the log, the source of truth, needs no change (its format is the same),
        and without this every start would replay the whole log until the next clean stop."""
        try:
            self.write_snapshot()
        except OSError as exc:  # the old snapshot stays; it is ignored again at the next start
            LOG.warning("the snapshot could not be rewritten in the current format (%s)", exc.strerror or exc)
            return
        self.snapshot_outdated = False
        self.snapshot_valid = True
        LOG.info("the snapshot was rewritten in format %d", snapshot.VERSION)

    def _load_snapshot(self, salt: bytes, log_size: int) -> int:
        reader = None
        try:
            reader = snapshot.Reader(self.io, self.snapshot_path)
            meta = reader.meta
            if meta.get("log_salt") != salt or not (logfile.HEADER_SIZE <= meta.get("log_pos", -1) <= log_size):
                raise snapshot.SnapshotInvalid("snapshot belongs to another log or a longer one")
            # the index segments' CRCs are checked after the start, on a thread of low priority that
            # begins now, while the rows load (segment.DEFERRED; index_check_step acts on the outcome)
            self._index = SearchIndex.load(reader.search_dump, self.dir, self.io, verify=DEFERRED)
            unverified = self._index.unverified_segments()
            self.index_check = SegmentCheck(unverified, self.io) if unverified else None
            reader.search_dump = None
            self.row_segments = reader.row_segments
            self.rows_tracked = reader.row_segments is not None
            self.snapshot_segments = self._index.segment_names() + [entry[0] for entry in reader.row_segments or ()]
        except (snapshot.SnapshotOutdated, DumpOutdated) as exc:
            LOG.warning("the snapshot is of an earlier format (%s): replaying the whole log once; a snapshot "
                        "of the current format is written right after", exc)
            self.snapshot_outdated = True
            self.snapshot_valid = False  # until _migrate_snapshot replaces it
            self.snapshot_segments = []  # formats before segments name none
            if reader is not None:
                reader.close()
            return logfile.HEADER_SIZE
        except (snapshot.SnapshotInvalid, ValueError, KeyError, TypeError) as exc:
            LOG.warning("ignoring the snapshot (%s); replaying the whole log", exc)
            self.snapshot_valid = False
            self._drop_index_check()
            self._index = SearchIndex()
            if reader is not None:
                reader.close()
            return logfile.HEADER_SIZE
        except BaseException:
            self._drop_index_check()
            if reader is not None:
                reader.close()
            raise
        try:
            return self._load_snapshot_state(meta, reader)
        except (snapshot.SnapshotInvalid, ValueError, KeyError, TypeError, IndexError) as exc:
            # A row segment that failed its checksum (checked on another thread while the tails were
            # applied: Reader._rows_checked), or, its checksum held, a bug or a checksum collision,
            # half-way through the rows: start again from a fresh state and replay the whole log, as for
            # any unusable snapshot.
            LOG.warning("ignoring the snapshot (%s); replaying the whole log", exc)
            self._drop_index_check()
            cursor_key = self.cursor_key
            self.log_text.close()  # the fresh state opens its own
            self.__init__(self.dir, self.io)  # type: ignore[misc]
            self.cursor_key = cursor_key
            self.salt = salt
            self.log_text.open(self.log_path, salt)
            self.snapshot_valid = False
            return logfile.HEADER_SIZE
        finally:
            reader.close()

    def _drop_index_check(self) -> None:
        """Stop the deferred checks of segments this start no longer uses (an ignored snapshot's, a
        discarded index's): their outcome no longer matters, and their reads would go on meanwhile."""
        if self.index_check is not None:
            self.index_check.stop()
            self.index_check = None

    def _load_snapshot_state(self, meta: dict[str, Any], reader: snapshot.Reader) -> int:
        self.last_seq = meta["last_seq"]
        last_id, last_ms = meta["clock"]
        rejected = self.clock.rejected
        if last_id:
            self.clock.observe_id(last_id)
        self.clock.observe_ms(last_ms)
        clock_poisoned = self.clock.rejected > rejected
        self.update_records = meta["update_records"]
        self.deleted_messages = meta["deleted_messages"]
        self.record_count = meta["record_count"]
        self.checkpoint_bytes = meta["checkpoint_bytes"]
        self._load_rids(meta["rids"])
        hotless = 0   # packed metadata without its hot fields (a tail written before part 11): unpacked here
        for sid, fields, size, *hot in reader.session_meta():  # a later one of a sid (a delta's) replaces it
            self.meta_bytes += size - self.meta_rec_sizes.get(sid, 0)
            if fields.__class__ is bytes:   # a version 3 tail's: kept as it is, never a dict in between
                if not is_packed_map(fields):
                    raise ValueError(f"the snapshot's metadata of session {sid!r} is not a map")
                self.session_meta.set_packed(sid, fields, hot=hot[0] if hot else None)
                hotless += not hot
            elif isinstance(fields, dict):
                self.session_meta[sid] = fields
            else:
                raise ValueError(f"the snapshot's metadata of session {sid!r} is not a map")
            self.meta_rec_sizes[sid] = size
        self.ingest.load(reader.checkpoints(), meta.get("ingest_totals"))
        self.unindexed.extend(meta.get("unindexed", ()))
        if reader.columnar():
            self._load_columns(reader)
        else:
            self._bulk_load(reader.rows())
        self._check_index_docs()
        # row segments of an earlier release (version 1: rows one by one; 2: converted): the next
        # snapshot writes a base of the current version, so that the next start only copies it in; and a
        # base of live rows with a gap before or between them that could lie as the rows do (its dead rows written:
        # an earlier release's, which this start copied), so that the next start maps it
        self.rows_legacy = reader.rows_outdated() or hotless > 0 or (
            reader.base_gapped() and self.table.live_span() is not None)
        if clock_poisoned:
            # the snapshot's clock lies beyond the bound (written before the bound existed): recover
            # the newest plausible id and time from the messages themselves
            for msg in self.by_id.values():
                self.clock.observe_id(msg.message_id)
                self.clock.observe_ms(msg.updated_at)
        # (its metadata figure is not read: the table counts what it holds as it loads, where a release
        # before part 16 counted Python objects the packed rows no longer hold — 2 GB at 5M events)
        self.body_bytes = meta["memory"][0]
        self.snapshot_pos = meta["log_pos"]
        self.snapshot_records = self.record_count
        self.snapshot_unindexed = len(self.unindexed)
        return meta["log_pos"]

    def _text_damaged(self, pos: int, size: int) -> None:
        """A message's record failed its checksum when its text was read (bit rot since the start, or
        before the snapshot's position, which no start re-reads): damage, as if found at start."""
        if self.corrupt is None:
            self._set_corrupt(f"log damaged at bytes {pos}-{pos + size} (a message's record failed its checksum "
                              f"when read); mutations are refused until `convmem-storaged --salvage` repairs the log")
            LOG.error("%s", self.last_error)

    def _set_corrupt(self, message: str) -> None:
        self.corrupt = message
        self.last_error = message

    # ------------------------------------------------------------------ applying records
    def _old(self, mid: str) -> Message | None:
        """The live message an update or delete record replaces, for ``_apply``: built even when its files
        can be read from neither copy (a damaged packed ext and bit rot in its log record, which marks the
        store damaged), so that a start's replay goes on instead of failing the start."""
        seq = self.table.seq_of(mid)
        return None if seq is None else self.table.get(seq, lenient=True)

    def _apply(self, rec: list[Any], pos: int, size: int, msg: Message | None = None) -> None:
        """Apply one record framed at ``pos`` (``size`` bytes) in the log: the one path by which both
        replay and every live mutation change the state, so what a reply said and what a restart finds
        agree by construction. ``msg``: the message of a ``w``/``u`` record when the caller (a live
        mutation) has it built already — the same object ``Message.from_fields`` would make of the
        record. Records that contradict the state are skipped (only replay of a salvaged log meets
        them; a live mutation checks first)."""
        kind = rec[records.TAG]
        if kind == records.WRITE:
            self.record_count += 1  # message records only: what records_removed is counted against
            fields = rec[records.W_MESSAGE]
            if fields[records.MESSAGE_ID] in self.by_id:
                return
            msg = msg or Message.from_fields(fields)
            self._store_text(msg, rec, pos, size)
            self._insert(msg)
            self._after_record(rec[records.RID], records.WRITE, msg.message_id, msg.revision, msg.seq, msg.timestamp)
            self.clock.observe_id(msg.message_id)
            self.clock.observe_ms(msg.updated_at)
        elif kind == records.UPDATE:
            self.record_count += 1
            fields = rec[records.U_MESSAGE]
            old = self._old(fields[records.MESSAGE_ID])
            if old is None and not self.salvaging:
                return
            msg = msg or Message.from_fields(fields)
            self._store_text(msg, rec, pos, size)
            if old is None:
                # an update carries the message's whole state: salvage can restore a message whose
                # original write record was lost to damage
                self._insert(msg)
            else:
                self._replace(old, msg)
            self.update_records += 1
            self._after_record(rec[records.RID], records.UPDATE, msg.message_id, msg.revision, rec[records.U_SEQ], msg.updated_at)
            self.clock.observe_ms(msg.updated_at)
        elif kind == records.DELETE:
            self.record_count += 1
            old = self._old(rec[records.D_MESSAGE_ID])
            if old is None:
                return
            self._remove(old)
            self.deleted_messages += 1
            # since 0.3 a delete record carries its time; before, the request id's own time stands in
            rid = rec[records.RID]
            seen = rec[records.D_SEEN_MS] if len(rec) > records.D_SEEN_MS else (ulid_ms(rid) if rid else 0)
            self._after_record(rid, records.DELETE, old.message_id, 0, rec[records.D_SEQ], seen)
        elif kind == records.CHECKPOINT:
            self.last_seq = max(self.last_seq, rec[records.C_LAST_SEQ])
            if rec[records.C_LAST_ID]:
                self.clock.observe_id(rec[records.C_LAST_ID])
            self.clock.observe_ms(rec[records.C_LAST_MS])
            self._load_rids(rec[records.C_RIDS])
            self.checkpoint_bytes = size
        elif kind == records.SESSION:
            self._apply_session_meta(rec[records.S_SESSION_ID], rec[records.S_FIELDS], size)
        elif kind == records.INGEST:
            self.ingest.apply(rec[records.K_SOURCE], rec[records.K_KEY], rec[records.K_VALUE], size)
            if self.rows_tracked:
                self.checkpoints_changed.add((rec[records.K_SOURCE], rec[records.K_KEY]))

    def _store_text(self, msg: Message, rec: list[Any], pos: int, size: int) -> None:
        """The message's text stays in the log, in the record at ``pos``; memory keeps its location."""
        msg.rec_size = size
        msg.stored_at(self.log_text, locate(pos, rec, rec[-1][records.CONTENT]))

    def _apply_session_meta(self, sid: str, fields: dict[str, Any], size: int) -> None:
        """Merge a session's metadata (absent fields keep their values)."""
        meta = self.session_meta.get(sid)
        self.session_meta[sid] = fields if meta is None else {**meta, **fields}
        self.meta_rec_sizes[sid] = self.meta_rec_sizes.get(sid, 0) + size
        self.meta_bytes += size
        self.sessions_version += 1
        if self.rows_tracked:
            self.metas_changed.add(sid)

    def _after_record(self, rid: str | None, op: str, mid: str, rev: int, seq: int, seen_ms: int) -> None:
        if seq > self.last_seq:
            self.last_seq = seq
        if rid:
            self._remember(rid, op, mid, rev, seen_ms)

    def _load_rids(self, entries: list[list[Any]]) -> None:
        """The request-id window of a checkpoint record or snapshot: [rid, op, mid, rev, seen_ms]
        (before 0.3 without seen_ms: the request id's own time stands in, bounded like any)."""
        for entry in entries:
            rid, op, mid, rev = entry[:4]
            self._remember(rid, op, mid, rev, entry[4] if len(entry) > 4 else ulid_ms(rid))

    def _remember(self, rid: str, op: str, mid: str, rev: int, seen_ms: int) -> None:
        # never later than the clock's bound: a poisoned record must not keep its id for ever
        seen_ms = min(seen_ms, self.clock.limit_ms())
        rids = self.rids
        rids[rid] = (op, mid, rev, seen_ms)
        rids.move_to_end(rid)
        while len(rids) > RID_WINDOW:
            rids.popitem(last=False)
        # oldest first (in the order seen), so the expired ones are at the front
        cutoff = self.clock.wall_ms() - L.REQUEST_ID_RETENTION_S * 1000
        while rids and next(iter(rids.values()))[3] < cutoff:
            rids.popitem(last=False)

    def rid_entries(self) -> list[list[Any]]:
        """The request-id window as stored (checkpoint record, snapshot), without the expired ones."""
        cutoff = self.clock.wall_ms() - L.REQUEST_ID_RETENTION_S * 1000
        return [[rid, op, mid, rev, seen] for rid, (op, mid, rev, seen) in self.rids.items() if seen >= cutoff]

    def _insert(self, msg: Message, track_order: bool = True) -> None:
        """Add a message to every index (to the search index's queue: see ``unindexed``)."""
        self.table.put(msg)
        session = self.sessions.get(msg.session_id)
        if session is None:
            session = self.sessions[msg.session_id] = Session(msg.session_id)
            self.session_keys[session_digest(msg.session_id)] = session.sid
            self.session_order.invalidate()
        span = (session.min_ts, session.max_ts, len(session.seqs))
        session.add(msg)
        if span[2] == 0 or span[:2] != (session.min_ts, session.max_ts):
            self.sessions_version += 1
            if span[2] and span[0] != session.min_ts and track_order:
                self.session_order.moved(session.sid, span[0])
        self.relations.add(msg)
        if msg.ext is not None:
            self.touches.add(msg)
        self.unindexed.append(msg.seq)
        if self.rows_tracked:
            self.rows_changed.add(msg.seq)
        self.live_bytes += msg.rec_size
        self.body_bytes += msg.body_bytes()

    def _bulk_load(self, rows: Iterable[list[Any]]) -> None:
        """_insert for a snapshot's messages (rows in creation order, search index already loaded):
        the same structures, minus the per-message work a snapshot makes unnecessary. A row of the
        current length goes into the table without a Message being built."""
        sessions, relations, touches, table = self.sessions, self.relations, self.touches, self.table
        load_row, src, full = table.load_row, self.log_text, records.RECORD_FIELDS + 1
        live = 0
        for row in rows:
            if len(row) == full:
                load_row(row, src)
                (mid, sid, seq, ts, _, _, _, _, _, _, _, kind, _, summary, edges, _, etype, tool, ext,
                 rec_size) = row
                files = ext[3] if ext is not None else None
            else:  # a row written before events existed
                msg = Message.from_row(row, src)
                table.put(msg)
                mid, sid, seq, ts, kind, summary = msg.message_id, msg.session_id, msg.seq, msg.timestamp, msg.kind, msg.summary
                edges, etype, tool, rec_size = msg.relations, msg.etype, msg.tool, msg.rec_size
                files = msg.ext[3] if msg.ext is not None else None
            session = sessions.get(sid)
            if session is None:
                session = sessions[sid] = Session(table.session_id(seq))
                self.session_keys[session_digest(sid)] = session.sid
            session.load(seq, ts, kind, summary is not None, etype, tool)
            if edges:
                relations.add_edges(mid, table.relations[seq])
            if files:
                touches.add_files(seq, files)
            live += rec_size
        table.index_all_ids()
        self.live_bytes += live
        self.session_order.invalidate()
        self.sessions_version += 1

    def _load_columns(self, reader: snapshot.Reader) -> None:
        """_bulk_load for a snapshot whose rows are all in version 2 row segments: the table is filled
        by numpy copies (MessageTable.load_segments), the sessions built from it at once; only the
        rarer fields (relations, touched files) take a Python step each."""
        table = self.table
        table.load_segments(reader.column_segments(), self.log_text, self.last_seq)
        self.sessions = sessions = sessions_from_table(table)   # each made on first use, or when idle
        self.session_keys.later(sessions.pending_sids(), sessions.__contains__)
        for seq in sorted(table.relations):
            self.relations.add_edges(table.message_id(seq), table.relations[seq])
        self.touches.load_later(table.ext_files)   # loaded by the request loop when idle too (TouchIndex)
        self.live_bytes += int(table.column("rec_size", table.live_seqs()).sum())
        self.session_order.invalidate()
        self.sessions_version += 1

    @property
    def loading_later(self) -> bool:
        """What a start left to the request loop's idle slices is not all done (``load_later_step``)."""
        return self.sessions.pending or self.session_keys.pending or self.touches.pending

    def load_later_step(self, deadline: float | None, interrupted: Callable[[], bool] | None = None) -> None:
        """Go on with what a start left to idle time — its sessions (``SessionMap``), their history ids'
        digests (``SessionKeys``), the touch index (``TouchIndex.load_later``) — until ``deadline``
        (the monotonic clock) or ``interrupted()``; each is also finished by its first use that needs it."""
        for part in (self.sessions, self.session_keys, self.touches):
            if part.pending:
                part.load_step(deadline, interrupted)
                return

    def etype_filter(self, types) -> Callable[[np.ndarray], np.ndarray]:
        """accept_docs for SearchIndex.search_own: which of an array of seqs are messages of one of
        ``types`` (dead or unknown seqs: no), in C: each seq's event type is a byte of the message
        table's (MessageTable.etype, 0 for no live message)."""
        wanted = np.zeros(256, bool)
        for t in types:
            wanted[ETYPE_CODE[t]] = True
        table = self.table

        def accept_docs(docs: np.ndarray) -> np.ndarray:
            view = np.frombuffer(table.etype, np.uint8)  # dropped on return: the table must grow it
            out = np.zeros(len(docs), bool)
            inside = (docs >= 0) & (docs < len(view))
            out[inside] = wanted[view[docs[inside]]]
            return out
        # what the search index keeps bounds over this filter's docs by (storaged/filterbounds.py)
        accept_docs.cache_key = (wanted.tobytes(), table.etype_epoch)
        return accept_docs

    def _remove(self, msg: Message, keep_slot: bool = False, track_order: bool = True) -> None:
        if not keep_slot:  # else replaced: _insert puts the new row over it
            self.table.drop(msg.seq)
            if self.rows_tracked:
                self.rows_changed.discard(msg.seq)
                self.rows_deleted.add(msg.seq)
        session = self.sessions[msg.session_id]
        span = (session.min_ts, session.max_ts)
        session.remove(msg, self.table.timestamp)
        if not session.seqs:
            del self.sessions[msg.session_id]
            self.session_keys.pop(session_digest(msg.session_id), None)
            self.session_order.invalidate()
            self.sessions_version += 1
        elif span != (session.min_ts, session.max_ts):
            self.sessions_version += 1
            if span[0] != session.min_ts and track_order:
                self.session_order.moved(session.sid, span[0])
        self.relations.remove(msg)
        if msg.ext is not None:
            self.touches.remove(msg)
        if msg.seq in self._index:  # else it is still queued: the queue skips what is no longer live
            self._index.remove(msg.seq)
        self.live_bytes -= msg.rec_size
        self.body_bytes -= msg.body_bytes()

    def _replace(self, old: Message, new: Message) -> None:
        # by_seq keeps its slot so that iterating it stays in creation order (the rebuild relies on it).
        # A new revision keeps its timestamp: the session's place in the sessions view moves only if
        # the message's session emptied and came back (then it is a new entry, not a move).
        session = self.sessions[old.session_id]
        started = session.min_ts
        self._remove(old, keep_slot=True, track_order=False)
        self._insert(new, track_order=False)
        if self.sessions[new.session_id].min_ts != started:
            self.session_order.invalidate()

    # ------------------------------------------------------------------ the search index
    @property
    def search(self) -> SearchIndex:
        """The search index, with every queued message indexed first (what a search must see)."""
        if self.unindexed:
            self.index_step(None)
        return self._index

    def release_index_step(self) -> None:
        """After a batch of requests: one small step of freeing the index's replaced frozen lists
        (SearchIndex.release_step)."""
        self._index.release_step(busy=True)

    def index_segments(self) -> tuple[int, int]:
        """(segment files the search index maps, their bytes): for the start-up log line."""
        return len(self._index.segment_names()), self._index.mapped_bytes()

    def search_flush_due(self) -> bool:
        """The search index's live lists are big enough to be written as a segment (SearchIndex.flush_due)."""
        return self._index.flush_due()

    def replace_index(self, index: SearchIndex) -> SearchIndex:
        """A rebuild's index, which holds every live message: nothing stays queued. Returns the old one."""
        old, self._index = self._index, index
        self.unindexed.clear()
        return old

    def index_check_step(self) -> str | None:
        """Once the deferred CRC checks of the start's index segments are done: what failed (None while
        they run, or when every segment the index still maps holds). Taken once."""
        check = self.index_check
        if check is None or not check.done():
            return None
        self.index_check = None
        mapped = set(self._index.segment_names())
        failed = [why for seg, why in check.result() if seg.name in mapped]
        if not failed:
            LOG.info("the search index's segments passed their CRC check")
        return "; ".join(failed) or None

    def discard_index(self, reason: str) -> None:
        """A segment of the search index failed its CRC after the start (``reason``): the index is
        dropped and every live message queued for a new one, which the loop and its catch-up child build
        from the log as after a replay; searches are answered BUSY until it holds them all, writes go on.
        The damaged file goes once no snapshot names it. The caller has ended any child that works on
        the old index (a snapshot's, a catch-up's)."""
        self.last_error = self.index_damage = (
            f"the search index was damaged ({reason}); it is being built again from the log, searches are "
            f"answered BUSY until it is done")
        LOG.error("%s", self.last_error)
        self._drop_index_check()
        fresh = SearchIndex()
        fresh.retire(self.replace_index(fresh))
        self.unindexed.extend(self.table.live_seqs().tolist())
        # as for a start's replayed queue: a snapshot is due once the index catches up on it, so the
        # next start maps the new index, not the damaged segment again
        self.snapshot_unindexed = len(self.unindexed)

    def _check_index_docs(self) -> None:
        """Every live slot of the loaded index names a message the snapshot holds and has not queued for
        the index, and the slots' lengths add up to the dump's totals. The segments' CRCs
        are checked only after the start (segment.DEFERRED), and their per-slot tables are read now: a
        doc number rotten there would fail every search that reaches it, and leave its message out; a
        rotten length would skew every score and the totals its removal changes. Numpy over the slots
        (~50 ms at five million); if one does not hold, the index is built again."""
        docs = self._index.live_docs()
        etype = np.frombuffer(self.table.etype, np.uint8)
        try:
            bad = len(docs) and (int(docs.min()) < 0 or int(docs.max()) >= len(etype) or not etype[docs].all())
        finally:
            del etype
        if not bad and len(docs) and self.unindexed:   # a queued message is in no slot yet
            bad = np.isin(docs, np.fromiter(self.unindexed, np.int64, len(self.unindexed))).any()
        if bad:
            self.discard_index("its per-slot tables name messages the snapshot does not hold")
        elif not self._index.lengths_agree():
            self.discard_index("its per-slot lengths do not sum to the totals its dump gives")

    def _index_whole_again(self) -> None:
        """After a ``discard_index``: once the new index holds every message (nothing queued, no
        catch-up child's range open), health is no longer DEGRADED for it."""
        if self.index_damage is not None and not self.unindexed and self._index.hole is None:
            LOG.info("the search index has been built again from the log")
            if self.last_error == self.index_damage:
                self.last_error = ""
            self.index_damage = None

    def index_step(self, deadline: float | None, interrupted: Callable[[], bool] | None = None) -> bool:
        """Index queued messages, oldest first, until the queue is empty or the monotonic clock passes
        ``deadline`` (None: until empty; the clock is read after each message) or ``interrupted()`` says
        a request waits (asked every few messages, so a request waits about a millisecond behind this). True while some remain. A message deleted or replaced since
        it was queued is skipped (its replacement is queued after it). A text that fails its checksum
        is left out of the index (the store is then marked damaged, ``_text_damaged``)."""
        queue, by_seq, index = self.unindexed, self.by_seq, self._index
        n = 0
        while queue:
            seq = queue.popleft()
            if seq in index:
                continue
            try:
                msg = by_seq.get(seq)
                if msg is None:
                    continue
                text = msg.content
            except OSError as exc:   # (a record that fails its checksum: the store is marked damaged)
                LOG.error("message seq %d left out of the search index: %s", seq, exc)
                continue
            index.add(seq, text, msg.summary, msg.tags)
            n += 1
            # the clock after every message: one tool output of 64 KB is ~10 ms of tokenising, and four
            # of them between two looks at the clock held the loop 50-80 ms past a 20 ms slice
            if deadline is not None and (time.monotonic() > deadline or (
                    not n & 3 and interrupted is not None and interrupted())):
                break
        if not queue:
            self._index_whole_again()
        return bool(queue)

    def index_backlog(self) -> int:
        """Messages not in the search index yet: those queued, and those a catch-up child is indexing
        (what an import waits on: ``index_queue_max``)."""
        hole = self._index.hole
        return len(self.unindexed) + (hole[1] - hole[0] if hole is not None else 0)

    def split_catch_up(self, share: float) -> SplitCatchUp | None:
        """Hand the first ``share`` of the messages queued for the search index to a forked child (a
        start's replayed tail, an import's backlog: the child indexes its part on the other core while
        the loop indexes the rest): their slots are reserved now (SearchIndex.reserve), in queue order,
        so the loop's own go on above them. None when nothing is queued (or a hole is open already)."""
        index, by_seq = self._index, self.by_seq
        if index.hole is not None:
            return None
        todo = [seq for seq in dict.fromkeys(self.unindexed) if seq in by_seq and seq not in index]
        seqs = todo[:int(len(todo) * share)]
        if not seqs:
            return None
        lo, _ = index.reserve(seqs)
        return SplitCatchUp(seqs, lo, new_segment_name())

    def write_split(self, split: SplitCatchUp) -> None:
        """In the child: index ``split``'s messages into their reserved slots and write them as its
        segment (SearchIndex.write_range). A text that cannot be read is indexed without its content
        (as the loop leaves such a message out), so the slots stay the reserved ones."""
        by_seq = self.by_seq

        def items():
            for seq in split.seqs:
                msg = by_seq[seq]
                try:
                    text = msg.content
                except OSError:
                    text = ""
                yield seq, text, msg.summary, msg.tags

        SearchIndex.write_range(split.slot_lo, items(), self.io, self.dir, split.name)

    def finish_split(self, split: SplitCatchUp, written: bool) -> bool:
        """The child has ended: put its segment in the reserved range (``written``: it exited 0), or,
        if there is none or it is not the range's, give the range up and queue its messages again
        (the loop indexes them in its slices). Its file is removed unless the index took it. True if
        the segment is in."""
        path = os.path.join(self.dir, split.name)
        if self._index.hole is None:   # not this index's (a rebuild's replaced it): nothing to fill
            if self.io.exists(path):
                _remove_all(self.io, [path])
            return False
        if written:
            try:
                self._index.fill(Segment(path, self.io, verify=False))
                self._index_whole_again()
                return True
            except (OSError, ValueError) as exc:
                LOG.warning("the search index's catch-up segment could not be used (%s); indexing its "
                            "messages here", exc)
        else:
            LOG.warning("the search index's catch-up child failed; indexing its messages here")
        self.unindexed.extendleft(reversed(self._index.abandon()))
        if self.io.exists(path):
            _remove_all(self.io, [path])
        return False

    def catch_up(self, budget_s: float) -> None:
        """Before a search through the daemon: index what is queued within ``budget_s``, else refuse
        BUSY (the index is catching up after a big import or a replay) rather than hold the loop.
        While a child indexes part of the queue (``split_catch_up``) the index is not whole: BUSY."""
        if self._index.hole is not None:
            raise ProtocolError(E.BUSY, "the search index is catching up (a child process indexes part of its "
                                        "queue); retry shortly",
                                retry_after_ms=L.BUSY_RETRY_AFTER_MS)
        if self.unindexed and self.index_step(time.monotonic() + budget_s):
            raise ProtocolError(E.BUSY, f"the search index is catching up ({len(self.unindexed)} messages to "
                                        f"index); retry shortly", retry_after_ms=L.BUSY_RETRY_AFTER_MS)

    # ------------------------------------------------------------------ lookups
    def live(self, message_id: str) -> Message:
        """The live message ``message_id`` names, or NOT_FOUND: the rule of update_message and of the
        content and context views."""
        msg = self.by_id.get(message_id)
        if msg is None:
            raise ProtocolError(E.NOT_FOUND, "message_id names no live message")
        return msg

    # ------------------------------------------------------------------ mutations
    def _check_writable(self) -> None:
        if self.corrupt is not None:
            raise ProtocolError(E.CORRUPT_STORE, "the log is damaged; mutations are refused until it is salvaged")
        if self.broken is not None:
            raise ProtocolError(E.IO_ERROR, "the log cannot be written safely since an earlier I/O failure; "
                                            "restart the daemon")
        if self.rebuilding:
            raise ProtocolError(E.BUSY, "rebuild_index is running; retry shortly",
                                retry_after_ms=L.BUSY_RETRY_AFTER_MS)

    def _commit(self, recs: list[list[Any]], messages: list[Message | None] | None = None) -> None:
        """Append records durably in one write and one fsync (a batch), then apply each through
        ``_apply``, the path replay takes. ``messages``: the message of each ``w``/``u`` record, built
        already by the mutation (None for the others). Nothing is applied unless all were appended.

        A failure the writer fully undid (nothing stored) sets ``last_error`` (health DEGRADED) only
        until the next append succeeds: a transient ENOSPC or EIO must not leave the health wrong for
        good. A failure that could not be undone (``broken``) stays until a restart."""
        framed = [logfile.encode_record(self.salt, r) for r in recs]
        data = framed[0] if len(framed) == 1 else b"".join(framed)
        try:
            pos = self.writer.append(data, sync=not self.group_commit)
            if self.group_commit:
                self.unsynced = True
        except logfile.LogWriterBroken as exc:
            self.broken = str(exc)
            self.last_error = f"log append failed and could not be undone: {exc.strerror or exc}"
            LOG.error("%s", self.last_error)
            raise ProtocolError(E.IO_ERROR, "the log write failed and the log could not be restored") from None
        except OSError as exc:
            self.last_error = f"log append failed ({exc.strerror or exc}); the request was not applied"
            self.transient_error = self.last_error
            LOG.error("%s", self.last_error)
            raise ProtocolError(E.IO_ERROR, "the log write or flush failed; nothing was stored") from None
        if self.transient_error is not None:
            if self.last_error == self.transient_error:
                LOG.info("the log accepts appends again; clearing the error of the earlier failed append")
                self.last_error = ""
            self.transient_error = None
        for i, (record, f) in enumerate(zip(recs, framed)):
            self._apply(record, pos, len(f), messages[i] if messages else None)
            pos += len(f)

    def _repeat(self, rid: str | None, op: str) -> dict[str, Any] | None:
        """The first result of a request id seen before, or None if it is new."""
        if not rid or rid not in self.rids:
            return None
        first_op, mid = self.rids[rid][:2]
        if first_op != op:
            raise ProtocolError(E.VALIDATION_ERROR, "request_id was already used by a different operation")
        if op == records.DELETE:
            return {"status": "OK"}
        msg = self.by_id.get(mid)
        if msg is None:
            raise ProtocolError(E.NOT_FOUND, "this request was already applied, and its message has since "
                                             "been deleted")
        reply: dict[str, Any] = {"status": "OK"}
        if op == records.UPDATE:
            reply["changed"] = True
        reply["message"] = msg.to_dict()
        return reply

    def write_message(self, req: R.WriteMessage, rid: str | None = None) -> dict[str, Any]:
        self._check_writable()
        repeat = self._repeat(rid, records.WRITE)
        if repeat is not None:
            return repeat
        message_id, ts = self.clock.new_id()
        seq = self.last_seq + 1
        msg = message_from_args(message_id, req.session_id, seq, ts, req.role, req.content, req.metadata)
        self._commit([records.write(rid, msg.fields(req.content))], [msg])
        return {"status": "OK", "message": msg.to_dict(req.content)}

    def update_message(self, req: R.UpdateMessage, rid: str | None = None) -> dict[str, Any]:
        self._check_writable()
        repeat = self._repeat(rid, records.UPDATE)
        if repeat is not None:
            return repeat
        old = self.live(req.message_id)
        check_revision(old, req.expected_revision)
        md = old.metadata_values()
        if req.metadata is not None:
            md = req.metadata.apply(md)
        old_content = old.content
        content = req.content if req.content is not None else old_content
        if content == old_content and md == old.metadata_values():
            return {"status": "OK", "changed": False, "message": old.to_dict(old_content)}
        seq = self.last_seq + 1
        new = message_from_args(old.message_id, old.session_id, old.seq, old.timestamp, old.role, content, md)
        new.etype, new.tool, new.ext = old.etype, old.tool, old.ext  # an event stays the event it was
        new.revision = old.revision + 1
        new.updated_at = self.clock.now_ms()
        self._commit([records.update(rid, seq, new.fields(content))], [new])
        return {"status": "OK", "changed": True, "message": new.to_dict(content)}

    def delete_message(self, req: R.DeleteMessage, rid: str | None = None) -> dict[str, Any]:
        self._check_writable()
        repeat = self._repeat(rid, records.DELETE)
        if repeat is not None:
            return repeat
        msg = self.by_id.get(req.message_id)
        if msg is None or (req.session_id is not None and req.session_id != msg.session_id):
            return {"status": "NOT_FOUND"}
        self._commit([records.delete(rid, self.last_seq + 1, msg.message_id, self.clock.now_ms())])
        return {"status": "OK"}

    def import_messages(self, req: R.ImportMessages, rid: str | None = None) -> dict[str, Any]:
        """Store exported (or transcript) messages as they are: ids, times, revisions, metadata, event
        facts — with the metadata of their sessions and the ingester's checkpoints, if given. The whole
        batch at once; the daemon runs ``import_steps`` between other requests instead."""
        return R.run_steps(self.import_steps(req, rid))

    def import_steps(self, req: R.ImportMessages, rid: str | None = None) -> Generator[None, None, dict[str, Any]]:
        """``import_messages`` as a series of commits of at most IMPORT_SLICE_MESSAGES messages (or
        IMPORT_SLICE_BYTES of text), each durable (its own append and fsync) and applied before the
        generator yields, so the request loop serves others between them and a slice never shows them
        anything that is not on disk. Each slice looks its messages up when it is built, so a write or
        an import served in between is seen: nothing is stored twice.

        Idempotent by message id: a message whose id is already live is left alone, so importing a
        file twice stores nothing twice. Session records go in the first slice and the checkpoints in
        the last, so a crash in between leaves a prefix whose checkpoints (if any survived) never claim
        events that did not — as a torn single append always did; the ingester sends the batch again
        and only what is missing is stored."""
        self._check_writable()
        behind = self.index_backlog()
        if self.index_queue_max is not None and behind >= self.index_queue_max:
            raise ProtocolError(E.BUSY, f"the search index is {behind} messages behind; retry the "
                                        f"import shortly", retry_after_ms=L.BUSY_RETRY_AFTER_MS)
        seen: set[str] = set()
        imported = existing = future = 0
        committed = False  # a slice of this import is stored
        clock = self.clock
        todo = req.messages
        i = 0
        batch = [records.session(s.session_id, s.fields) for s in req.sessions
                 if s.fields and any(self.session_meta.get(s.session_id, {}).get(k) != v for k, v in s.fields.items())]
        built: list[Message | None] = [None] * len(batch)
        while True:
            try:
                if i:
                    self._check_writable()
                seq = self.last_seq
                text_bytes = 0
                for m in todo[i:i + IMPORT_SLICE_MESSAGES]:
                    i += 1
                    if m.message_id in self.by_id or m.message_id in seen:
                        existing += 1
                        continue
                    seen.add(m.message_id)
                    seq += 1
                    msg = message_from_args(m.message_id, m.session_id, seq, m.timestamp, m.role, m.content,
                                            m.metadata, m.event)
                    msg.revision, msg.updated_at = m.revision, m.updated_at
                    if clock.beyond_id(msg.message_id) or clock.beyond_ms(msg.timestamp) or clock.beyond_ms(msg.updated_at):
                        future += 1  # stored as it is; the clock does not observe it (see idgen)
                    batch.append(records.write(None, msg.fields(m.content)))
                    built.append(msg)
                    text_bytes += len(m.content)
                    if text_bytes >= IMPORT_SLICE_BYTES:
                        break
                last = i >= len(todo)
                if last:
                    batch += [records.ingest(c.source, c.key, c.value) for c in req.checkpoints]
                    built += [None] * len(req.checkpoints)
                if batch:
                    self._commit(batch, built)
            except ProtocolError as exc:
                if not committed:  # nothing of this import is stored: the error as it is
                    raise
                raise ProtocolError(exc.code, f"{exc.message} (the import stopped after storing {imported} "
                                              f"of its messages; send it again to store the rest: those "
                                              f"stored are skipped)", exc.retry_after_ms) from None
            if batch:
                committed = True
                imported += len(built) - built.count(None)
            if last:
                break
            batch, built = [], []
            yield
        if future:
            LOG.warning("import: %d messages carry an id or time more than %d h beyond the wall clock; stored as "
                        "they are, the clock of new writes ignores them", future, L.CLOCK_SKEW_MAX_MS // 3_600_000)
        reply = {"status": "OK", "imported": imported, "existing": existing}
        if future:
            reply["future_times"] = future  # only when there are some: the usual reply stays as it was
        return reply

    # ------------------------------------------------------------------ snapshot and health
    def session_meta_entries(self, sids: Iterable[str] | None = None, packed: bool = False) -> list[list[Any]]:
        """[sid, fields, rec_size] of the sessions ``sids`` (None: all) that have metadata; ``packed``:
        fields as the msgpack bytes kept, and a fourth item, their hot fields' values (a row segment's
        tail: snapshot.write_row_columns; a start takes both without unpacking)."""
        metas, sizes = self.session_meta, self.meta_rec_sizes
        keys = [sid for sid in (metas if sids is None else sorted(sids)) if sid in metas]
        if packed:
            return [[sid, metas.packed(sid), sizes.get(sid, 0), list(metas.hot(sid))] for sid in keys]
        return [[sid, metas[sid], sizes.get(sid, 0)] for sid in keys]

    def snapshot_meta(self, salt: bytes, log_pos: int, extras: bool = True) -> dict[str, Any]:
        """The snapshot's ``meta``; ``extras``: with the session metadata and checkpoints (a snapshot
        with inline rows), else they are left empty (a manifest: the row segments' tails hold them)."""
        return {
            "log_salt": salt, "log_pos": log_pos, "last_seq": self.last_seq,
            "clock": [self.clock.last_id, self.clock.last_ms],
            "update_records": self.update_records, "deleted_messages": self.deleted_messages,
            "record_count": self.record_count, "checkpoint_bytes": self.checkpoint_bytes,
            "rids": self.rid_entries(),
            "memory": [self.body_bytes, self.table.held_bytes, self.table.entries_heap_bytes()],
            "session_meta": self.session_meta_entries() if extras else [],
            "checkpoints": self.ingest.dump() if extras else [],
            # the checkpoints' per-source sums, so that a start takes their bytes as they are (IngestState.load)
            "ingest_totals": self.ingest.stored_totals(),
            # queued for the search index, not in the dump: queued again at the next start
            "unindexed": [seq for seq in dict.fromkeys(self.unindexed) if seq in self.by_seq and seq not in self._index],
        }

    def snapshot_due(self) -> bool:
        """Whether the snapshot on disk is behind: the log grew since, or the search index indexed
        messages the snapshot left queued, or its live lists are big enough to be written as a segment
        (SearchIndex.flush_due), or a base of the rows is due (``base_due``: rows of an earlier
        version, which every start would convert again, or deltas a stop left in its place), or a
        packed ext was read again from the log (extfiles.py: every start would read it again)."""
        return self._can_snapshot() and (
            self.snapshot_pos != self.writer.size or len(self.unindexed) < self.snapshot_unindexed
            or self.search_flush_due() or self.base_due() or bool(self.table.ext_files.repaired))

    def _can_snapshot(self) -> bool:
        return self.writer is not None and not self.corrupt and not self.broken and self.relocation is None

    def rebase_due(self) -> bool:
        """A background snapshot should write a base that takes the place of rows a compaction's
        relocation rewrote (``rows_relocated``). Asked at every turn of the request loop: a flag, not a
        scan of the rows' liveness (``rebase_span``, a few ms at five million events)."""
        return self.rows_relocated and self._can_snapshot()

    def base_due(self, more: int = 0) -> bool:
        """The next snapshot should write a base: the row segments include one of an earlier version or
        a tail without the hot fields (``rows_legacy``), or ROW_SEGMENTS_MAX are in use, or the deltas,
        with ``more`` rows and dead seqs, would pass half the base. (A stop's snapshot may leave it to
        the next start's background one: ``write_snapshot``'s ``base_later``.)"""
        segments = self.row_segments
        return segments is not None and (self.rows_legacy or len(segments) >= ROW_SEGMENTS_MAX or (
            sum(n + dead for _, n, dead in segments[1:]) + more > max(ROW_DELTA_MIN, segments[0][1] // 2)))

    def plan_snapshot(self, inline: bool = False, base_later: bool = False,
                      catch_up: bool = True) -> "SnapshotPlan":
        """Before a snapshot: freeze the search index's live postings and plan the segment the
        snapshot writes (SearchIndex.plan), and the row segment: a delta of the rows changed since
        the last snapshot, or a base of every row when there is no base on disk, or when the deltas
        would pass half of it or ROW_SEGMENTS_MAX files are in use (so a start reads at most ~1.5× the rows,
        and every row is rewritten a bounded number of times). Called by the process that keeps the
        store (before a background snapshot's fork, or ``inline``: a snapshot this thread writes
        itself, whose merges stay small; ``base_later``: a delta even where a base is due, see
        ``write_snapshot``; ``catch_up``: a background child indexes the messages still queued too, see
        below). The changed rows are taken from the store's sets here:
        ``abandon_snapshot`` puts them back if the snapshot is never installed."""
        index_plan = self._index.plan(inline)
        changed, deleted = self.rows_changed, self.rows_deleted
        repaired = self.table.ext_files.repaired   # (read again from the log: written right by this one)
        if repaired:
            changed |= repaired
            self.table.ext_files.repaired = set()
        metas, checkpoints = self.metas_changed, self.checkpoints_changed
        self.rows_changed, self.rows_deleted = set(), set()
        self.metas_changed, self.checkpoints_changed = set(), set()
        self.rows_tracked = True  # what changes from here on goes into the snapshot after this one
        segments = self.row_segments
        seqs = sorted(seq for seq in changed if seq in self.by_seq)
        # a delta's weight at start: its rows, and its dead seqs, each dropping a row of the base
        base = segments is None or not base_later and (self.base_due(len(seqs) + len(deleted))
                                                        or not inline and self.rebase_due())
        dead = [] if base else sorted(deleted)
        span = None
        if base:
            name = snapshot.rows_name()
            rows_after = [[name, self.table.base_rows(), 0]]   # (its dead rows included)
            seqs = []
            # a background child's base is written so that this process can map it in place of its rows
            # (not an inline one's: this process is about to stop, or to start serving from the file)
            span = self.table.rebase_span() if not inline else None
            if span is not None:   # the rows written from the fork on are noted
                self.table.rebase_track(span[1])
        elif seqs or dead or metas or checkpoints:
            name = snapshot.rows_name()
            rows_after = [*segments, [name, len(seqs), len(dead)]]
        else:
            name = None
            rows_after = list(segments)
        # a child indexes what is still queued (on its own core) and writes it too: a start after a crash
        # then indexes only the log past the snapshot, not also the queue the snapshot was taken with
        catchup = new_segment_name() if self.unindexed and catch_up and not inline else None
        return SnapshotPlan(index_plan, self._index.names_after(index_plan), name, base, seqs, dead,
                            rows_after, changed, deleted, catchup, metas, checkpoints, span)

    def abandon_snapshot(self, plan: "SnapshotPlan") -> None:
        """A planned snapshot that was not installed: its changed rows go into the next one. (A seq
        deleted since is skipped then: only live seqs are written.)"""
        self.rows_changed |= plan.changed
        self.rows_deleted |= plan.deleted
        self.metas_changed |= plan.metas
        self.checkpoints_changed |= plan.checkpoints
        if plan.rebase is not None:
            self.table.rebase_abandon()

    def write_snapshot_file(self, tmp: str, plan: "SnapshotPlan") -> int:
        """Write (and fsync) ``plan``'s index segment and row segment, then the manifest to ``tmp``,
        not yet in place. Returns the log position it covers. Used directly by a forked child, which
        sees a frozen copy of the state (the index segment it writes is put in its copy of the index,
        for the dump)."""
        pos = self.writer.size
        if plan.index is not None:
            self._index.write_and_adopt(plan.index, self.io, self.dir)
        if plan.catchup_name is not None:
            self.index_step(None)
            catchup = self._index.plan_live(plan.catchup_name)
            if catchup is not None:
                self._index.write_and_adopt(catchup, self.io, self.dir)
        if plan.rows_name is not None:
            path = os.path.join(self.dir, plan.rows_name)
            if plan.rows_base:
                columns = self.table.segment_columns(self.table.live_seqs(), own=plan.rebase is not None, holes=True)
                metas, checkpoints = self.session_meta_entries(packed=True), self.ingest.dump(packed=True)
            else:
                columns = self.table.segment_columns(np.asarray(plan.rows_seqs, np.int64))
                metas = self.session_meta_entries(plan.metas, packed=True)
                checkpoints = self.ingest.dump(plan.checkpoints, packed=True)
            try:
                snapshot.write_row_columns(self.io, path, columns, plan.rows_dead, metas, checkpoints)
                self.io.sync_dir(self.dir)
            except BaseException:
                _remove_all(self.io, [path])
                raise
        # the session metadata and checkpoints are in the row segments' tails (write_rows)
        meta = dict(self.snapshot_meta(self.salt, pos, extras=False), rows=plan.rows_after)
        snapshot.write_file(self.io, tmp, meta, (), self._index.dump())
        return pos

    def install_snapshot(self, tmp: str | None, pos: int, plan: "SnapshotPlan", background: bool = False) -> None:
        """Put a written snapshot in place (``tmp`` None: its writer did, a background child), then map
        the segment it was written with (if this process did not write it) and remove the segment
        files no longer named (released a cut at a time by a thread when ``background``: the
        request loop installs it)."""
        if tmp is not None:
            self.io.replace(tmp, self.snapshot_path)
            self.io.sync_dir(self.dir)
        self.snapshot_pos = pos
        self.row_segments = [list(entry) for entry in plan.rows_after]
        if plan.rows_base:
            self.rows_legacy = self.rows_relocated = False
        catchup = [plan.catchup_name] if plan.catchup_name is not None and self.io.exists(
            os.path.join(self.dir, plan.catchup_name)) else []
        self.snapshot_segments = [*plan.index_names, *catchup, *(entry[0] for entry in plan.rows_after)]
        if plan.rebase is not None:
            if background:
                self._rebase_open(plan)
            else:   # (written in this process: a test's, or a child's plan installed as one's own)
                self.table.rebase_abandon()
        index_plan = plan.index
        if index_plan is not None and index_plan.name not in self._index.segment_names():
            try:
                self._index.adopt(index_plan, Segment(os.path.join(self.dir, index_plan.name), self.io, verify=False))
            except (OSError, ValueError) as exc:  # the frozen postings go on serving; a later snapshot writes them
                LOG.warning("the new index segment could not be mapped (%s); keeping its postings in memory", exc)
        self.collect_segments(wait=not background)

    def _rebase_open(self, plan: "SnapshotPlan") -> None:
        """Map the base a background snapshot wrote in the table's own numbering, to take the place of
        the rows once checked (``rebase_step``); if it cannot be, the rows stay as they are."""
        first, end = plan.rebase
        path = os.path.join(self.dir, plan.rows_name)
        try:
            where = snapshot.rows_sections_at(self.io, path, first, end)
            if not where.own:   # its tables held too much no row uses: written numbered as ever
                self.table.rebase_abandon()
                LOG.info("the new base %s is numbered as its own: the rows stay in memory until a later base",
                         plan.rows_name)
                return
            self.table.rebase_open(path, where, first, end)
        except (OSError, ValueError, snapshot.SnapshotInvalid) as exc:
            self.table.rebase_abandon()
            LOG.warning("the new base %s cannot take the place of the rows in memory (%s): they stay there "
                        "until a restart", plan.rows_name, exc)

    def rebase_step(self, rows: int) -> bool:
        """One step of mapping a base in place of the rows (MessageTable.rebase_step), if one is under
        way. True while there is more to do."""
        t = self.table
        checking, held = t.rebase_checking, len(t.rows)
        try:
            more = t.rebase_step(rows)
            if checking and not t.rebase_checking:
                LOG.info("the rows below seq %d are read from the base %s now: %.0f MiB of rows held in memory "
                         "let go", t.nbase, t.rows_file, (held - len(t.rows)) / 2 ** 20)
            return more
        except RebaseMismatch as exc:
            LOG.warning("the new base cannot take the place of the rows in memory (%s): they stay there", exc)
            return False

    def collect_segments(self, wait: bool = True) -> None:
        """Remove the segment files that neither the snapshot on disk nor the index names: a merge's
        inputs once a snapshot without them is in place, a crashed write's orphan — and nothing while
        the snapshot on disk was not read (``snapshot_segments`` None). Never called
        while a rebuild's worker writes its own segment (which nothing names until its install):
        snapshots are neither started nor installed during a rebuild, and a stop cancels it first.
        Not ``wait``: each name removed now and the blocks freed a cut at a time by a thread
        (``FileIO.release``: unlinking a file frees its blocks, ~70 ms for 200 MB, and every fdatasync
        meanwhile waits for it; a merge's inputs grow with the store). A segment still mapped here is
        never read again once nothing names it, so cutting its file under the mapping is safe."""
        if self.snapshot_segments is None:
            return
        keep = set(self.snapshot_segments) | set(self._index.segment_names())
        try:
            names = self.io.listdir(self.dir)
        except OSError:
            return
        doomed = [os.path.join(self.dir, name) for name in names if is_segment_name(name) and name not in keep]
        _remove_all(self.io, doomed, release=not wait, mapped=self.table.mapped_names())

    def write_snapshot(self, base_later: bool = False, relocate_max: int | None = None) -> bool:
        """Save the state for a fast next start (at a clean stop). Skipped when nothing changed.
        ``base_later``: a stop of a daemon that snapshots in the background writes a delta even when a
        base is due (rows of an earlier version, too many or too big deltas) and leaves the base to
        the next start's background snapshot: a base is every row, 728 MB and ~10 s at five million
        events, past a supervisor's stop timeout (10 s by default), which would end the stop by SIGKILL.
        ``relocate_max``: skipped too while more messages than that are still to move to a rebuilt log
        (relocation_left): the rows must all name the current log first, and a stop right after a 5M
        rebuild spent ~8 s moving them. The rebuild's own snapshot stays; the next start replays what
        was written after it."""
        if relocate_max is not None and self.relocation_left() > relocate_max:
            return False
        self.relocate_step(None)  # a clean stop: the rows must all name the current log
        if not self.snapshot_due():
            return False
        tmp = self.snapshot_path + layout.TMP_SUFFIX
        plan = self.plan_snapshot(inline=True, base_later=base_later)
        try:
            self.install_snapshot(tmp, self.write_snapshot_file(tmp, plan), plan)
        except BaseException:
            self.abandon_snapshot(plan)
            raise
        self.snapshot_records = self.record_count
        self.snapshot_unindexed = len(self.unindexed)
        return True

    def snapshot_bytes(self) -> int:
        """The snapshot's size on disk: its file and the index segments it names (its manifest)."""
        return self.io.size(self.snapshot_path) + sum(
            self.io.size(os.path.join(self.dir, name)) for name in self.snapshot_segments or ())

    def log_size(self) -> int:
        return self.writer.size if self.writer is not None else self.io.size(self.log_path)

    def dead_bytes(self) -> int:
        size = self.log_size()
        if size == 0:
            return 0
        aux = self.meta_bytes + self.ingest.live_bytes
        return max(0, size - logfile.HEADER_SIZE - self.live_bytes - self.checkpoint_bytes - aux)

    def health(self) -> dict[str, Any]:
        search_bytes = self._index.memory_bytes() + 8 * len(self.unindexed)
        sizes = self.__dict__.get("_index_sizes")
        if sizes is None:
            sizes = self.__dict__["_index_sizes"] = IndexSizes()
        history, relation = sizes.get((self.last_seq, self.record_count, id(self.sessions), id(self.relations)),
                                      self.sessions, self.relations)
        # (the rows a base maps are the page cache's, as the segments' postings are: not counted)
        entries = self.table.entries_heap_bytes() + sys.getsizeof(self.by_id) + sys.getsizeof(self.by_seq) + sys.getsizeof(
            self.rids) + len(self.rids) * 200
        memory = {
            "store_entries_bytes": entries,
            "body_bytes": self.body_bytes,
            "metadata_bytes": self.table.held_bytes,
            "search_index_bytes": search_bytes,
            "history_index_bytes": history,
            "relation_index_bytes": relation,
        }
        memory = {"total_bytes": sum(memory.values()), **memory}
        return {
            "status": "DEGRADED" if self.last_error else "OK",
            "format_version": logfile.FORMAT_VERSION,
            "log_size": self.log_size(),
            "snapshot_size": self.snapshot_bytes(),
            "active_messages": len(self.by_id),
            "session_count": len(self.sessions),
            "deleted_messages": self.deleted_messages,
            "last_sequence": self.last_seq,
            "update_records": self.update_records,
            "dead_bytes": self.dead_bytes(),
            "memory_estimate": memory,
            "io": self.io.counters.as_dict(),
            "recovered_tail": self.recovered_tail,
            "snapshot_valid": self.snapshot_valid,
            "last_error": self.last_error,
        }

    def close(self) -> None:
        self._drop_index_check()   # (its thread reads the segments: it ends between two reads)
        if self.writer is not None:
            self.writer.close()
            self.writer = None
        if self.relocation is not None:  # nothing reads the old log any more: no need to move anyone
            self.relocation.old.close()
            if self.relocation.old_fd is not None:
                self.io.close(self.relocation.old_fd)
            self.relocation = None
        self.log_text.close()

    # ------------------------------------------------------------------ after a compaction
    def start_relocation(self, fd: int, seqs: Sequence[int], rec_sizes: Sequence[int], locs: Sequence[int],
                         old_fd: int | None = None) -> None:
        """Read new texts from ``fd`` (the compacted log) from now on, and move the messages at ``seqs``
        (every live message when it was written) to their records there in steps (``relocate_step``). Until a
        message has moved it reads the old log, whose descriptor stays open: an unlinked file with the
        same texts. No snapshot is written meanwhile (its rows would mix the two logs' locations)."""
        self.relocate_step(None)  # a relocation still running (a rebuild right after another) ends first
        old, self.log_text = self.log_text, LogText(self.io, on_damage=self._text_damaged)
        self.log_text.switch(fd, self.salt)
        self.relocation = _Relocation(old, seqs, rec_sizes, locs, old_fd)

    def relocation_left(self) -> int:
        """Messages still to move to a rebuilt log (relocate_step)."""
        r = self.relocation
        return 0 if r is None else len(r.seqs) - r.done

    def relocate_step(self, n: int | None) -> bool:
        """Move up to ``n`` messages (None: all that remain) to the compacted log; True while some
        remain. A message deleted or replaced since the compaction is skipped: its successor was
        written to the new log (every message still to move reads the old one, ``src``). Then the old
        log's blocks are freed a cut at a time by a thread (``FileIO.release_fd``): closing the last
        descriptor of an unlinked file frees them all at once, ~0.1 s for 350 MB, and every
        fdatasync meanwhile waits for it."""
        r = self.relocation
        if r is None:
            return False
        seqs, sizes, locs, src, old, table = r.seqs, r.rec_sizes, r.locs, self.log_text, r.old, self.table
        end = len(seqs) if n is None else min(len(seqs), r.done + n)
        grown = 0
        rec_size, alive, source_of = table.rec_size, table.alive, table.source_of
        for i in range(r.done, end):
            seq = seqs[i]
            if alive(seq) and source_of(seq) is old:
                grown += sizes[i] - rec_size(seq)
                table.relocate(seq, locs[i], sizes[i], src)
        r.done = end
        self.live_bytes += grown
        if end < len(seqs):
            return True
        self.relocation = None
        # every row was rewritten (each a private copy of the mapped base's page, or on the heap): the next
        # background snapshot writes a base of them that takes their place (MessageTable.relocated)
        self.table.relocated(src)
        self.rows_relocated = self.table.rebase_span() is not None   # (not a store mostly deleted)
        if r.old_fd is not None:
            r.old.close()  # not the last descriptor: frees nothing
            self.io.release_fd(r.old_fd)
        else:
            threading.Thread(target=r.old.close, name="close-old-log", daemon=True).start()
        return False

