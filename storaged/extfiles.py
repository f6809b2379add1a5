"""The exts of events that touched files, kept packed as a row segment holds them and decoded when read.

An ext with files (a tool call that read or changed files: its error flag, exit code, model and each
file as path, root, tail, project and operation) cannot be shared between messages the way the
others are (``model.shared_ext``), so the message table keeps it by seq. As Python tuples they cost
~200 bytes and a few objects an event, and building them at start was ~0.7 s of a five-million-event
start (355k of them: the row segment's head decoded into lists, then each turned into tuples). Since
version 4 a row segment holds them as three raw sections (``ext_seqs``, ``ext_ends``, ``ext_values``:
each entry the msgpack of ``[is_error, exit_code, model, [[path, root, tail, project, op]*]]``), which a
start copies in as they are; an entry is unpacked when a message is built (~2 µs), and a snapshot
copies the packed bytes of the entries it did not change without unpacking them.

The packed entries are checked at start as a whole (their seqs ascending, their ends within the
bytes); each one's shape is checked when it is unpacked — the first read of it, or the touch index's
load in the loop's idle slices right after a start (``TouchIndex.load_step``), which reads them all.
A segment's CRC has passed before any is read, so an entry that does not unpack can only have been
written so (a writer's bug): the message table then reads the ext again from the message's record in
the log (which a start would replay, and which holds it as written), keeps it, and logs a warning; its
row goes into the next snapshot, which writes it as it should be. Only the log's record failing its own
checksum as well fails the read (``TextDamaged``, as for a text).
"""
from __future__ import annotations

import logging
import operator
import sys
from collections.abc import Callable, Iterator, MutableMapping
from typing import Any

import msgpack
import numpy as np

from .model import shared_ext_from


LOG = logging.getLogger("convmem.storaged")


class ExtDamaged(ValueError):
    """A packed ext entry that does not unpack to an ext with files."""


def pack_entry(ext: tuple) -> bytes:
    """A packed entry: the msgpack of an ext tuple with files, as a row segment holds it."""
    is_error, exit_code, model, files = ext
    return msgpack.packb([is_error, exit_code, model, [list(f) for f in files]], use_bin_type=True)


def unpack_entry(raw: bytes | memoryview, seq: int) -> tuple:
    """The ext tuple of a packed entry; ExtDamaged if it is not one."""
    return shared_ext_from(_unpacked(raw, seq))


def _unpacked(raw: bytes | memoryview, seq: int) -> list[Any]:
    """A packed entry as a record holds an ext (a list), its shape checked; ExtDamaged if it is not one."""
    try:
        value = msgpack.unpackb(raw, use_list=True, raw=False, strict_map_key=True)
        if value.__class__ is not list or len(value) != 4 or value[3].__class__ is not list or not value[3]:
            raise TypeError("not an ext with files")
        for f in value[3]:
            if (f.__class__ is not list or len(f) != 5 or f[0].__class__ is not str or f[4].__class__ is not str
                    or any(v is not None and v.__class__ is not str for v in f[1:4])):
                raise TypeError("a file entry of another shape")
        return value
    except Exception as exc:
        raise ExtDamaged(f"the packed ext of message seq {seq} does not unpack ({type(exc).__name__}: {exc})") from None


def packed_sections(seqs: np.ndarray, values: list[bytes]) -> dict[str, bytes]:
    """The three row-segment sections of entries ``values`` at ``seqs`` (ascending)."""
    ends = np.cumsum([len(v) for v in values], dtype=np.int64) if values else np.zeros(0, np.int64)
    return {"ext_seqs": np.asarray(seqs, "<u8").tobytes(), "ext_ends": ends.astype("<u8").tobytes(),
            "ext_values": b"".join(values)}


def raw_entries(cols: dict[str, Any]) -> dict[int, list]:
    """seq -> the ext entry as a record holds it (a list), of a row segment of any version: for what
    reads its rows one by one (``columns.rows_from_columns``)."""
    if "ext_values" not in cols:
        return dict(cols["ext_files"])
    seqs, ends = checked_sections(cols)
    values, out, at = bytes(cols["ext_values"]), {}, 0
    for seq, end in zip(seqs.tolist(), ends.tolist()):
        out[seq] = _unpacked(values[at:end], seq)
        at = end
    return out


def checked_sections(cols: dict[str, Any]) -> tuple[np.ndarray, np.ndarray]:
    """(seqs, ends) of a row segment's packed entries, as int64 arrays; ValueError unless the seqs
    ascend and the ends ascend within the values' bytes."""
    seqs = np.frombuffer(cols["ext_seqs"], "<u8").astype(np.int64)
    ends = np.frombuffer(cols["ext_ends"], "<u8").astype(np.int64)
    size = len(cols["ext_values"])
    if len(seqs) != len(ends):
        raise ValueError("a row segment's ext entries and their ends differ in number")
    if len(seqs) and (seqs[0] < 0 or not (seqs[1:] > seqs[:-1]).all()):
        raise ValueError("a row segment's ext entries are not by ascending seq")
    if len(ends) and (ends[0] <= 0 or not (ends[1:] > ends[:-1]).all() or ends[-1] != size):
        raise ValueError("a row segment's ext entries do not divide its bytes")
    if not len(ends) and size:
        raise ValueError("a row segment's ext bytes belong to no entry")
    return seqs, ends


class ExtFiles(MutableMapping):
    """seq -> ext tuple with files (the message table's ``ext_files``): the entries a start loaded,
    packed and sorted by seq, and a dict of those stored since. A packed entry replaced or dropped
    is only marked gone (its bytes stay until the next start)."""

    __slots__ = ("fresh", "_seqs", "_starts", "_ends", "_blob", "_alive", "_count", "_repair", "repaired")

    def __init__(self, repair: Callable[[int], tuple] | None = None) -> None:
        self.fresh: dict[int, tuple] = {}
        self._repair = repair   # seq -> its ext read again from the log, for an entry that does not unpack
        self.repaired: set[int] = set()   # the seqs so read, for the next snapshot's delta (Store.plan_snapshot)
        self._seqs = np.zeros(0, np.int64)
        self._starts = self._ends = self._seqs
        self._blob = b""
        self._alive = np.zeros(0, bool)
        self._count = 0

    def load_packed(self, parts: list[tuple[np.ndarray, np.ndarray, np.ndarray, bytes | memoryview]]) -> None:
        """Take the packed entries of row segments: per segment (its seqs, ends, which of them to keep,
        its values' bytes); a seq is kept by one segment at most (the one whose row the table holds)."""
        seqs, starts, ends, blobs, at = [], [], [], [], 0
        for s, e, keep, blob in parts:
            b = np.r_[0, e[:-1]] if len(e) else e
            seqs.append(s[keep])
            starts.append(b[keep] + at)
            ends.append(e[keep] + at)
            blobs.append(blob)
            at += len(blob)
        if not seqs:
            return
        all_seqs = np.concatenate(seqs)
        order = np.argsort(all_seqs, kind="stable")
        self._seqs = all_seqs[order]
        if len(self._seqs) > 1 and not (self._seqs[1:] > self._seqs[:-1]).all():
            raise ValueError("two row segments keep an ext entry of one seq")
        self._starts, self._ends = np.concatenate(starts)[order], np.concatenate(ends)[order]
        self._blob = b"".join(blobs)
        self._alive = np.ones(len(self._seqs), bool)
        self._count = len(self._seqs)

    def _find(self, seq: int) -> int:
        """The position of ``seq``'s live packed entry, or -1."""
        i = int(np.searchsorted(self._seqs, seq))
        if i < len(self._seqs) and self._seqs[i] == seq and self._alive[i]:
            return i
        return -1

    def __getitem__(self, seq: int) -> tuple:
        ext = self.fresh.get(seq)
        if ext is not None:
            return ext
        i = self._find(seq) if self._count else -1
        if i < 0:
            raise KeyError(seq)
        try:
            return unpack_entry(memoryview(self._blob)[int(self._starts[i]):int(self._ends[i])], seq)
        except ExtDamaged as exc:
            if self._repair is None:
                raise
            # the log holds what the snapshot's entry should: read from there, kept, logged once
            ext = self._repair(seq)
            LOG.warning("%s; its ext was read again from the log", exc)
            self[seq] = ext
            self.repaired.add(seq)
            return ext

    def __setitem__(self, seq: int, ext: tuple) -> None:
        if self._count:
            self._drop_packed(seq)
        self.fresh[seq] = ext

    def __delitem__(self, seq: int) -> None:
        if self.fresh.pop(seq, None) is None and not (self._count and self._drop_packed(seq)):
            raise KeyError(seq)

    def discard(self, seq: int) -> None:
        """Forget ``seq``'s entry if it has one (without unpacking it, as ``pop`` would)."""
        if self.fresh.pop(seq, None) is None and self._count:
            self._drop_packed(seq)

    def _drop_packed(self, seq: int) -> bool:
        i = self._find(seq)
        if i < 0:
            return False
        self._alive[i] = False
        self._count -= 1
        return True

    def __contains__(self, seq: object) -> bool:
        if seq in self.fresh:
            return True
        try:
            return self._count > 0 and self._find(operator.index(seq)) >= 0
        except TypeError:
            return False

    def __len__(self) -> int:
        return len(self.fresh) + self._count

    def __iter__(self) -> Iterator[int]:
        """The seqs, in no particular order (callers sort)."""
        yield from list(self.fresh)
        if self._count:
            yield from self._seqs[self._alive].tolist()

    def sections(self, seqs: np.ndarray | None = None) -> dict[str, bytes]:
        """The row-segment sections of the entries of ``seqs`` (ascending; None: every entry): the
        packed ones copied as they are, the fresh ones packed."""
        live = np.flatnonzero(self._alive) if self._count else np.zeros(0, np.int64)
        p_seqs = self._seqs[live]
        f_seqs = np.fromiter(self.fresh, np.int64, len(self.fresh))
        if seqs is not None:
            keep = np.isin(p_seqs, seqs)
            live, p_seqs = live[keep], p_seqs[keep]
            f_seqs = f_seqs[np.isin(f_seqs, seqs)]
        blob = self._blob
        values = [blob[a:b] for a, b in zip(self._starts[live].tolist(), self._ends[live].tolist())]
        values += [pack_entry(self.fresh[s]) for s in f_seqs.tolist()]
        all_seqs = np.concatenate([p_seqs, f_seqs])
        order = np.argsort(all_seqs, kind="stable")
        return packed_sections(all_seqs[order], [values[i] for i in order.tolist()])

    def entry_bytes(self, seq: int) -> int:
        """The packed size of ``seq``'s entry (0: none) — the same whether it is fresh or was loaded packed."""
        ext = self.fresh.get(seq)
        if ext is not None:
            return len(pack_entry(ext))
        i = self._find(seq) if self._count else -1
        return int(self._ends[i] - self._starts[i]) if i >= 0 else 0

    def memory_bytes(self) -> int:
        return (sys.getsizeof(self.fresh) + len(self._blob) + self._seqs.nbytes + self._starts.nbytes
                + self._ends.nbytes + self._alive.nbytes)
