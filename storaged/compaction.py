"""rebuild_index: compact the log to the live messages and rebuild the snapshot and search index.

Split in two so that the daemon can run the slow part beside its request loop:
``prepare`` (in a forked child of the daemon, ``run_child``: it sees the state frozen — the daemon
refuses mutations meanwhile — and tokenises on a core of its own, never taking the loop's GIL)
writes the new log, the new index as segment files (one every REBUILD_FLUSH_BYTES of index, merged
as the daemon's are), and the snapshot naming them, beside the old ones; ``install`` (request-loop thread, ``read_result`` first) renames them into place, fsyncs the
directory and swaps the in-memory parts. A crash at any point leaves either the old files or the new
ones: the snapshot names the salt of the log it belongs to, so an old snapshot is never applied to a
new log or the reverse, and a segment nothing names is removed (``Store.collect_segments``).
"""
from __future__ import annotations

import errno
import logging
import os
import struct
import time
import traceback
from array import array
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any, Callable, Generator, Sequence

import msgpack

from protocol import errors as E
from protocol.errors import error_reply
from protocol.requests import run_steps

from . import layout
from . import log as logfile
from . import records
from . import snapshot
from .fileio import Paced
from .search import SearchIndex
from .store import Store
from .text import PackedLocations, TextDamaged, locate

LOG = logging.getLogger("convmem.storaged")

WRITE_BATCH = 1 << 20
# the in-memory index a rebuild's worker holds before it writes it as a segment (merged geometrically,
# as the daemon's snapshots merge theirs): built whole, 5M events took the worker past 24 GB and the
# kernel killed it; written every ~256 MiB it holds about that (bench/SPIKES.md, part 13)
REBUILD_FLUSH_BYTES = 256 << 20
FLUSH_CHECK_EVERY = 2048  # messages between two looks at it (and between two pauses)


@dataclass
class Prepared:
    salt: bytes
    log_size: int
    record_count: int
    checkpoint_bytes: int
    rec_sizes: Sequence[int]
    text_locs: Sequence[int]            # where each message's text lies in the new log
    meta_sizes: dict[str, int]          # session id -> bytes of its one merged "s" record
    checkpoint_sizes: dict[tuple[str, str], int]
    search: SearchIndex
    messages_indexed: int
    records_removed: int
    bytes_before: int
    seconds: float
    rids: OrderedDict                   # the request-id window written to the new log (Store.rids' form)
    seqs: Sequence[int]                 # the seqs of the messages written, in that order (Store.relocate_step moves them)
    rows_name: str                      # the row segment (a base) the new snapshot names
    base_rows: int                      # ... and its rows (its dead ones included)


def prepare(store: Store, pause=lambda: None) -> Prepared:
    """Write ``log.compact``, the new index's segment and ``snapshot.tmp``. ``pause`` is called
    between batches (``rebuild`` and the bench's probe pass none)."""
    t0 = time.monotonic()
    io = store.io
    salt = logfile.new_salt()
    live = store.table.live_seqs()   # each message built as it is copied, never all at once
    bytes_before = store.log_size()
    tmp_log = store.log_path + layout.COMPACT_SUFFIX
    # the request-id window without the expired ids: a rebuild must never carry them on (a small log
    # would otherwise grow by the whole window at every rebuild)
    rids = store.rid_entries()
    checkpoint = logfile.encode_record(salt, records.checkpoint(store.last_seq, store.clock.last_id, store.clock.last_ms, rids))
    rec_sizes = array("Q")       # (an int object each in a list: ~180 MB at 5M events)
    text_locs: list[int] = []    # (past 64 bits beyond a 16 MiB log: PackedLocations splits them)
    index = SearchIndex()
    # session metadata of the sessions that still have messages, one merged record each; every
    # ingest checkpoint (they describe files, not messages, and must survive the rebuild)
    metas = {sid: dict(fields) for sid, fields in store.session_meta.items() if sid in store.sessions}
    meta_sizes: dict[str, int] = {}
    checkpoint_sizes: dict[tuple[str, str], int] = {}
    written: list[str] = []  # the segments this rebuild wrote (some merged into later ones)

    def flush_index() -> None:
        plan = index.plan()
        if plan is None:
            return
        written.append(plan.name)
        index.write_and_adopt(plan, io, store.dir)
        index.drop_retired()  # (the lists it replaced: no request loop here frees them in steps)
        # its own segments this one merged: nothing names them (no snapshot yet), so they go now (left
        # to the install's collection, every merge's inputs stayed on disk to the end). Only unlinked:
        # their blocks go with the mapping (a cut file's mapping faults when read)
        named = set(index.segment_names())
        for name in [n for n in written if n not in named]:
            written.remove(name)
            _quiet_remove(io, os.path.join(store.dir, name))

    fd = io.open_new(tmp_log)
    try:
        out = Paced(io, fd)
        out.write(logfile.make_header(salt) + checkpoint)
        size = logfile.HEADER_SIZE + len(checkpoint)
        batch: list[bytes] = []
        batch_len = 0

        def emit(rec: bytes) -> None:
            nonlocal batch, batch_len, size
            batch.append(rec)
            batch_len += len(rec)
            if batch_len >= WRITE_BATCH:
                out.write(b"".join(batch))
                size += batch_len
                batch, batch_len = [], 0
                pause()

        for sid, fields in metas.items():
            rec = logfile.encode_record(salt, records.session(sid, fields))
            meta_sizes[sid] = len(rec)
            emit(rec)
        for i, seq in enumerate(live.tolist()):
            m = store.table.get(seq)
            content = m.content  # read from the old log
            record = records.write(None, m.fields(content))
            rec = logfile.encode_record(salt, record)
            text_locs.append(locate(size + batch_len, record, content))
            rec_sizes.append(len(rec))
            emit(rec)
            index.add(m.seq, content, m.summary, m.tags)
            if i % FLUSH_CHECK_EVERY == FLUSH_CHECK_EVERY - 1:
                pause()
                if index.unwritten_bytes() >= REBUILD_FLUSH_BYTES:
                    flush_index()
        for (src, key), value in list(store.ingest.checkpoints.items()):
            rec = logfile.encode_record(salt, records.ingest(src, key, value))
            checkpoint_sizes[(src, key)] = len(rec)
            emit(rec)
        if batch:
            out.write(b"".join(batch))
            size += batch_len
        io.sync(fd)
    except BaseException:
        _remove_names(io, store.dir, written)
        raise
    finally:
        io.close(fd)
    meta = store.snapshot_meta(salt, size, extras=False)
    meta["update_records"] = 0
    meta["deleted_messages"] = 0
    meta["record_count"] = len(live)
    meta["checkpoint_bytes"] = len(checkpoint)
    meta["rids"] = rids
    meta["unindexed"] = []  # this index holds every live message
    # the session metadata and the checkpoints go in the base's tail (snapshot.write_rows)
    session_metas = [[sid, fields, meta_sizes[sid], list(store.session_meta.hot(sid))] for sid, fields in metas.items()]
    checkpoints = [[src, key, store.ingest.checkpoints[(src, key)], n] for (src, key), n in checkpoint_sizes.items()]
    # the rest of the new index as a segment: the snapshot names its segments, and the daemon maps them
    # at the install instead of holding a rebuilt index's millions of objects (and a start maps them too)
    rows_name = snapshot.rows_name()
    try:
        flush_index()
        columns = store.table.segment_columns(live, text_locs, rec_sizes, holes=True)
        base_rows = len(columns["seqs"]) // 8
        meta["rows"] = [[rows_name, base_rows, 0]]
        snapshot.write_row_columns(io, os.path.join(store.dir, rows_name), columns, (), session_metas, checkpoints)
        io.sync_dir(store.dir)
        snapshot.write_file(io, store.snapshot_path + layout.TMP_SUFFIX, meta, (), index.dump())
    except BaseException:
        # nothing names them (the caller discards the other temps)
        _remove_names(io, store.dir, [*written, rows_name])
        raise
    return Prepared(salt, size, len(live), len(checkpoint), rec_sizes, text_locs, meta_sizes,
                    checkpoint_sizes,
                    index, len(live), max(0, store.record_count - len(live)), bytes_before, time.monotonic() - t0,
                    OrderedDict((rid, (op, mid, rev, seen)) for rid, op, mid, rev, seen in rids),
                    array("Q", live.tobytes()), rows_name, base_rows)


def install(store: Store, p: Prepared, background: bool = False) -> dict[str, Any]:
    """Swap the prepared files and structures in. Returns the contract's result. ``background``: the
    request loop installs it, so the old segment files are released a cut at a time by a thread.

    Once the new log has been renamed into place the store follows it whatever fails afterwards:
    appending to the old, unlinked file would lose every later write. A failure after that point
    leaves a consistent store (the snapshot is only an accelerator); if the directory could not be
    synced, the rename is not known to be durable, so mutations are refused until a restart.
    """
    io = store.io
    tmp_snapshot = store.snapshot_path + layout.TMP_SUFFIX
    marks = [("", time.monotonic())]  # its phases' ends, told in the log when the whole is slow
    try:
        # opened before the rename, so that the store never holds locations without their file
        text_fd = io.open_read(store.log_path + layout.COMPACT_SUFFIX)
    except OSError:
        discard(store)
        raise
    # the old log's blocks are freed a cut at a time once the last message has moved off it
    # (Store.relocate_step), not by this rename nor by its last close (fileio.RELEASE_STEP_BYTES)
    old_log = io.open_to_release(store.log_path)
    try:
        io.replace(store.log_path + layout.COMPACT_SUFFIX, store.log_path)
    except OSError:
        io.close(text_fd)
        if old_log is not None:
            io.close(old_log)
        discard(store)
        raise
    if store.writer is not None:
        store.writer.close()
        store.writer = None
    store.salt = p.salt
    # The messages move to their new locations in steps between requests (Store.relocate_step: ~0.5 s
    # of the loop at 275k messages done at once); until each has moved it reads the old file, which
    # stays open, unlinked, and holds the same texts. live_bytes follows each move.
    store.start_relocation(text_fd, p.seqs, p.rec_sizes, p.text_locs, old_log)
    marks.append(("the log swapped", time.monotonic()))
    store.checkpoint_bytes = p.checkpoint_bytes
    # (p's own dicts, taken over: copies of ~91k entries each cost the loop's turn ~5 ms at 5M events)
    store.session_meta = store.session_meta.only(p.meta_sizes)
    store.meta_rec_sizes = p.meta_sizes
    store.meta_bytes = sum(p.meta_sizes.values())
    store.ingest.rec_sizes = p.checkpoint_sizes
    store.ingest.live_bytes = sum(p.checkpoint_sizes.values())
    store.record_count = p.record_count
    store.rids = p.rids   # (made while the result was read: 100k entries took the install 40-70 ms)
    store.update_records = 0
    store.deleted_messages = 0
    marks.append(("the metadata kept", time.monotonic()))
    p.search.retire(store.replace_index(p.search))  # the old one is freed in steps
    marks.append(("the index swapped", time.monotonic()))
    store.snapshot_pos = -1
    failure: OSError | None = None
    # the old snapshot is held open across the rename and freed a cut at a time by a thread once the
    # rename is durable: a rename over the last name of a file nothing holds frees its blocks in the
    # call (35 ms for 68 MB on the request loop, and every fdatasync meanwhile waited for it)
    old_snapshot = io.open_to_release(store.snapshot_path)
    try:
        io.replace(tmp_snapshot, store.snapshot_path)
        snapshot_installed = True
    except OSError as exc:
        failure, snapshot_installed = exc, False
        _quiet_remove(io, tmp_snapshot)
    if old_snapshot is not None and not snapshot_installed:  # it keeps its name: nothing to free
        io.close(old_snapshot)
        old_snapshot = None
    try:
        io.sync_dir(store.dir)
    except OSError as exc:
        if old_snapshot is not None:  # the rename is not known to be durable: never cut the old one
            io.close(old_snapshot)
        store.broken = f"the directory could not be synced after the rebuild swapped the log: {exc.strerror or exc}"
        store.last_error = store.broken
        raise
    if old_snapshot is not None:
        io.release_fd(old_snapshot)
    marks.append(("the snapshot swapped and the directory synced", time.monotonic()))
    try:
        store.writer = logfile.LogWriter(io, store.log_path, p.salt, p.log_size)
    except OSError as exc:
        store.broken = f"the rebuilt log could not be opened: {exc.strerror or exc}"
        store.last_error = store.broken
        raise
    if failure is not None:
        raise failure
    store.snapshot_pos = p.log_size if snapshot_installed else -1
    # the new snapshot's base holds every row (mutations were refused since the worker's fork); without
    # it, no base of this log is on disk and the next snapshot writes one
    store.row_segments = [[p.rows_name, p.base_rows, 0]] if snapshot_installed else None
    store.rows_changed, store.rows_deleted = set(), set()
    store.metas_changed, store.checkpoints_changed = set(), set()
    store.rows_tracked = snapshot_installed
    store.snapshot_segments = [*p.search.segment_names(), p.rows_name] if snapshot_installed else []
    store.collect_segments(wait=not background)
    marks.append(("the old segments let go", time.monotonic()))
    if marks[-1][1] - marks[0][1] > SLOW_INSTALL_S:
        LOG.info("the rebuild's install took %.0f ms: %s", (marks[-1][1] - marks[0][1]) * 1000, ", ".join(
            f"{what} {(t - marks[i][1]) * 1000:.0f}" for i, (what, t) in enumerate(marks[1:])))
    store.snapshot_records = store.record_count
    store.snapshot_unindexed = 0
    store.snapshot_valid = True
    return {
        "status": "OK",
        "messages_indexed": p.messages_indexed,
        "records_removed": p.records_removed,
        "bytes_before": p.bytes_before,
        "bytes_after": p.log_size,
    }


def _remove_names(io, directory: str, names: Sequence[str]) -> None:
    for name in names:
        _quiet_remove(io, os.path.join(directory, name))


def _quiet_remove(io, path: str) -> None:
    try:
        io.remove(path)
    except OSError:
        pass


def discard(store: Store) -> None:
    """Remove the temporary files of a failed rebuild (best effort: they are removed at start anyway).
    The compacted log is as big as the live messages (6.5 GB at 5M events): its name goes now, its
    blocks a cut at a time by a thread (FileIO.release) — unlinked at once, it held the request loop
    701 ms after a 5M rebuild failed."""
    for path in (store.log_path + layout.COMPACT_SUFFIX, store.snapshot_path + layout.TMP_SUFFIX, result_path(store)):
        try:  # the result file too (its arrays: ~130 MB at 5M events, 31 ms unlinked on the loop)
            store.io.release(path)
        except OSError:
            pass


# an install longer than this tells the time of each of its phases in the log
SLOW_INSTALL_S = 0.05
# free space a rebuild wants beyond what it writes: the file system's own slack, and the appends of the
# requests that come meanwhile (reads only: mutations wait) and of the snapshots after it
SPACE_MARGIN = 64 << 20


def space_needed(store: Store) -> int:
    """About the bytes a rebuild writes before the files it replaces go: a log of the live records, then
    an index and rows the size of the snapshot's (at 5M events the data directory went 11.1 → 21.3 GB
    at its peak; this says 11.0 GB + the margin)."""
    return (store.live_bytes + store.meta_bytes + store.ingest.live_bytes + store.snapshot_bytes()
            + SPACE_MARGIN)


def space_shortfall(store: Store) -> str | None:
    """Why a rebuild should not start for want of disk space, or None. A rebuild that fills the disk
    fails anyway, and takes the space every other write needs with it while it runs."""
    free = store.io.free_bytes(store.dir)
    need = space_needed(store)
    if free is None or free >= need:
        return None
    return (f"rebuild needs about {need / 2**30:.1f} GiB free beside the store (it writes a compacted log, "
            f"an index and rows before the old ones go) and {free / 2**30:.1f} GiB is free; the store is unchanged")


def rebuild(store: Store) -> dict[str, Any]:
    """The whole rebuild in the calling thread (tests, salvage)."""
    store._check_writable()
    short = space_shortfall(store)
    if short is not None:
        raise OSError(errno.ENOSPC, short)
    try:
        prepared = prepare(store)
    except BaseException:
        discard(store)
        raise
    return install(store, prepared)


# ---------------------------------------------------------------- the rebuild's forked worker
def result_path(store: Store) -> str:
    return os.path.join(store.dir, layout.REBUILD_RESULT)


def failure_reply(exc: BaseException) -> dict[str, Any]:
    """The contract's error reply for a rebuild that failed before its install: the store is unchanged."""
    if isinstance(exc, TextDamaged):
        return error_reply(E.CORRUPT_STORE, f"rebuild stopped: {exc.strerror}; the store is unchanged, run --salvage")
    if isinstance(exc, OSError):
        return error_reply(E.IO_ERROR, f"rebuild failed writing its files ({exc.strerror or 'I/O error'}); "
                                       f"the store is unchanged")
    return error_reply(E.INTERNAL_ERROR, "rebuild failed; the store is unchanged")


# the worker's result file: a u64 (this byte order) giving the length of a msgpack head, the head, then —
# for a rebuild that succeeded — RESULT_ARRAYS, the head's "count" u64s each, raw, one after the other
RESULT_HEAD = struct.Struct("=Q")
RESULT_ARRAYS = ("rec_sizes", "loc_pos", "loc_rest", "seqs")
# bytes of the arrays the request loop reads a turn (~1 ms from the page cache); at 5M events they are
# ~170 MB, which read and decoded at once held the loop 217-229 ms, and a 16 MiB turn read from the disk
# (the page cache had let the file go) 62 ms
RESULT_CHUNK = 4 << 20
# entries of the result's big lists (session metadata sizes, request ids) decoded a turn (~3-5 ms)
DECODE_STEP = 16_384


def _decoded_in_steps(raw: bytes, put: Callable[[Any], None]) -> Generator[None, None, None]:
    """Each item of the msgpack array ``raw`` given to ``put``, DECODE_STEP a turn of the loop."""
    unpacker = msgpack.Unpacker(raw=False, use_list=True, max_buffer_size=max(len(raw), 1))
    unpacker.feed(raw)
    for i in range(unpacker.read_array_header()):
        if i % DECODE_STEP == DECODE_STEP - 1:
            yield
        put(unpacker.unpack())


def run_child(store: Store) -> int:
    """The body of a rebuild's worker, in a forked child of the daemon: ``prepare``, then what the
    daemon needs to install it (or the failure) in ``result_path`` (RESULT_HEAD), read by
    ``read_result`` once the child has exited 0."""
    arrays: list[bytes | memoryview] = []
    try:
        p = prepare(store)
        pos, rest = PackedLocations.pack(p.text_locs)
        arrays = [memoryview(p.rec_sizes).cast("B"), pos, rest, memoryview(p.seqs).cast("B")]
        result: dict[str, Any] = {"ok": {
            "salt": p.salt, "log_size": p.log_size, "record_count": p.record_count,
            "checkpoint_bytes": p.checkpoint_bytes, "count": len(p.seqs),
            # (the two big ones packed again inside the head: each decoded in its own turn of the loop)
            "meta_sizes": msgpack.packb(list(p.meta_sizes.items()), use_bin_type=True),
            "checkpoint_sizes": [[src, key, n] for (src, key), n in p.checkpoint_sizes.items()],
            "index": p.search.dump(), "records_removed": p.records_removed, "bytes_before": p.bytes_before,
            "seconds": p.seconds, "rids": msgpack.packb([[rid, *v] for rid, v in p.rids.items()], use_bin_type=True),
            "rows_name": p.rows_name, "base_rows": p.base_rows,
        }}
    except Exception as exc:
        arrays = []
        result = {"error": failure_reply(exc), "corrupt": store.corrupt,
                  "traceback": None if isinstance(exc, OSError) else traceback.format_exc()}
    head = msgpack.packb(result, use_bin_type=True)
    fd = store.io.open_new(result_path(store))
    try:
        store.io.write(fd, RESULT_HEAD.pack(len(head)) + head)
        for raw in arrays:
            store.io.write(fd, raw)
    finally:
        store.io.close(fd)
    return 0


def read_result(store: Store) -> tuple[str, Any]:
    """``read_result_steps`` at once (tests, the bench's probe)."""
    return run_steps(read_result_steps(store))


def _refused(what: str) -> tuple[str, Any]:
    return "error", error_reply(E.INTERNAL_ERROR, f"rebuild's worker {what}; the store is unchanged")


def read_result_steps(store: Store) -> Generator[None, None, tuple[str, Any]]:
    """("ok", Prepared) or ("error", reply) from a worker that exited 0 (``run_child``), in steps the
    request loop runs in separate turns: the head; the arrays RESULT_CHUNK bytes a turn (read, not
    mapped: a mapping's first touches cost more than the copy); the index mapped and its per-slot
    tables copied a segment a turn (SearchIndex.load_steps). The worker wrote
    the store's own messages, from the same frozen state: checked by their count and the last seq. A
    worker that found a damaged text has the store marked damaged here too. The index's segments are
    mapped without reading them whole (their writer has just fsynced them)."""
    io = store.io
    fd = io.open_read(result_path(store))
    try:
        size = os.fstat(fd).st_size
        first = io.pread(fd, RESULT_HEAD.size, 0)
        if len(first) != RESULT_HEAD.size:
            return _refused("left a truncated result")
        (n,) = RESULT_HEAD.unpack(first)
        raw_head = io.pread(fd, n, RESULT_HEAD.size) if n <= size else b""
        if len(raw_head) != n:
            return _refused("left a truncated result")
        result = msgpack.unpackb(raw_head, raw=False, use_list=True)
        if "error" in result:
            if result.get("traceback"):
                LOG.error("rebuild failed:\n%s", result["traceback"])
            if result.get("corrupt") and store.corrupt is None:
                store._set_corrupt(result["corrupt"])
                LOG.error("%s", store.last_error)
            return "error", result["error"]
        r = result["ok"]
        count = r["count"]
        at = RESULT_HEAD.size + n
        if size != at + 8 * count * len(RESULT_ARRAYS):
            return _refused("left a result of the wrong size")
        got: dict[str, array] = {}
        for name in RESULT_ARRAYS:
            a = got[name] = array("Q")
            end = at + 8 * count
            while at < end:
                yield
                chunk = io.pread(fd, min(RESULT_CHUNK, end - at), at)
                if not chunk:
                    return _refused("left a truncated result")
                a.frombytes(chunk)
                at += len(chunk)
    finally:
        io.close(fd)
    seqs = got["seqs"]
    by_seq = store.by_seq
    if len(seqs) != len(by_seq) or len(seqs) != r["record_count"] or (seqs and seqs[-1] != next(reversed(by_seq))):
        return _refused("saw other messages than the store holds")
    yield
    search = yield from SearchIndex.load_steps(r["index"], store.dir, store.io, verify=False)
    yield
    # a session's metadata record size and the request ids: ~91k and up to 100k entries at 5M events,
    # decoded DECODE_STEP a turn (the head with them in it took 38 ms; each list in one turn, up to 119)
    meta_sizes: dict[str, int] = {}
    yield from _decoded_in_steps(r["meta_sizes"], lambda e: meta_sizes.__setitem__(e[0], e[1]))
    checkpoint_sizes = {(src, key): n for src, key, n in r["checkpoint_sizes"]}
    rids: OrderedDict = OrderedDict()
    yield from _decoded_in_steps(r["rids"], lambda e: rids.__setitem__(e[0], tuple(e[1:])))
    return "ok", Prepared(
        r["salt"], r["log_size"], r["record_count"], r["checkpoint_bytes"], got["rec_sizes"],
        PackedLocations(memoryview(got["loc_pos"]).cast("B"), memoryview(got["loc_rest"]).cast("B")),
        meta_sizes, checkpoint_sizes, search, len(seqs),
        r["records_removed"], r["bytes_before"], r["seconds"], rids, seqs, r["rows_name"], r["base_rows"])
