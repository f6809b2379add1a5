"""The in-memory indexes besides search: per-session history, the relation graph, file touches.

History is a sorted list of creation sequence numbers per session (keyset pages are a bisect), with
the turn starts and counts the history interface needs; relations are stored on the message
(outgoing) plus a reverse map for incoming edges; file touches are indexed by the file's base name
for file_attention. ``IndexSizes`` estimates their memory for health without a walk per call.
"""
from __future__ import annotations

import bisect
import itertools
import logging
import sys
import time
from array import array
from collections.abc import Callable, Mapping

import numpy as np

from protocol import limits as L
from protocol.history import ASSISTANT_RESPONSE, TOOL_CALL, USER_INPUT, WEB_SEARCH_TOOLS

from .extfiles import ExtDamaged
from .handles import session_digest
from .text import TextDamaged
from .model import Message

LOG = logging.getLogger("convmem.storaged")

KIND_INDEX = {kind: i for i, kind in enumerate(L.MEMORY_KINDS)}


class Session:
    """A session's live messages in creation order, and what the history interface needs of it
    without walking them: its turns (a ``user_input`` event starts one, so the turn starts are those
    events' sequence numbers), its first and last event time, and how many tool calls it made.
    ``epoch`` changes whenever the order or membership changes other than by an append at the end,
    so that a page cursor pinned to the session can tell it went stale."""

    __slots__ = ("sid", "seqs", "kind_counts", "summary_seqs", "turn_seqs", "min_ts", "max_ts", "tool_calls",
                 "web_calls", "epoch")

    def __init__(self, sid: str) -> None:
        self.sid = sid                     # the one copy of the id that this session's messages share
        self.seqs = array("q")             # live messages, creation order (8 bytes each, not an int object)
        self.kind_counts = [0] * len(L.MEMORY_KINDS)
        self.summary_seqs: list[int] = []  # those of them with a summary, for representative_summary
        self.turn_seqs = array("q")        # those of them that are user_input events: where turns start
        self.min_ts = 0
        self.max_ts = 0
        self.tool_calls = 0
        self.web_calls = 0
        self.epoch = 0

    def add(self, msg: Message) -> None:
        if self.seqs and msg.seq < self.seqs[-1]:
            self.epoch += 1
        if not self.seqs:
            self.min_ts = self.max_ts = msg.timestamp
        else:
            self.min_ts = min(self.min_ts, msg.timestamp)
            self.max_ts = max(self.max_ts, msg.timestamp)
        _insort(self.seqs, msg.seq)
        self.kind_counts[KIND_INDEX[msg.kind]] += 1
        if msg.summary is not None:
            _insort(self.summary_seqs, msg.seq)
        self._count(msg.seq, msg.etype, msg.tool, 1)

    def _count(self, seq: int, etype: str, tool: str | None, step: int) -> None:
        if etype is USER_INPUT or etype == USER_INPUT:
            if step > 0:
                _insort(self.turn_seqs, seq)
            else:
                _remove_sorted(self.turn_seqs, seq)
        elif etype == TOOL_CALL:
            self.tool_calls += step
            if tool in WEB_SEARCH_TOOLS:
                self.web_calls += step

    def remove(self, msg: Message, timestamp_of: Callable[[int], int]) -> None:
        """``timestamp_of(seq)``: a live message's timestamp (the store's table)."""
        self.epoch += 1
        _remove_sorted(self.seqs, msg.seq)
        self.kind_counts[KIND_INDEX[msg.kind]] -= 1
        if msg.summary is not None:
            _remove_sorted(self.summary_seqs, msg.seq)
        self._count(msg.seq, msg.etype, msg.tool, -1)
        if self.seqs and msg.timestamp in (self.min_ts, self.max_ts):
            stamps = [timestamp_of(s) for s in self.seqs]
            self.min_ts, self.max_ts = min(stamps), max(stamps)

    def load(self, seq: int, ts: int, kind: str, summarised: bool, etype: str, tool: str | None) -> None:
        """``add`` for a snapshot's messages (their fields, not a Message), which arrive in creation
        order: by seq, except a message a salvage restored from its update after its write record was
        lost (it came last, with its old seq), which goes where ``add`` would put it, as a replay does."""
        seqs = self.seqs
        if seqs and seq < seqs[-1]:
            self.epoch += 1
            bisect.insort(seqs, seq)
            if summarised:
                _insort(self.summary_seqs, seq)
        else:
            seqs.append(seq)
            if summarised:
                self.summary_seqs.append(seq)
        if len(seqs) == 1:
            self.min_ts = self.max_ts = ts
        elif ts < self.min_ts:
            self.min_ts = ts
        elif ts > self.max_ts:
            self.max_ts = ts
        self.kind_counts[KIND_INDEX[kind]] += 1
        if etype != ASSISTANT_RESPONSE:
            self._count(seq, etype, tool, 1)

    def size_bytes(self) -> int:
        return (sys.getsizeof(self) + sys.getsizeof(self.seqs) + sys.getsizeof(self.kind_counts)
                + sys.getsizeof(self.summary_seqs) + sys.getsizeof(self.turn_seqs))


def _insort(seqs: list[int], seq: int) -> None:
    if not seqs or seqs[-1] < seq:  # the common case: a new message is the newest
        seqs.append(seq)
    else:
        bisect.insort(seqs, seq)


def _insort_once(seqs: list[int], seq: int) -> None:
    """``_insort``, unless ``seq`` is there already."""
    if not seqs or seqs[-1] < seq:
        seqs.append(seq)
    else:
        i = bisect.bisect_left(seqs, seq)
        if i == len(seqs) or seqs[i] != seq:
            seqs.insert(i, seq)


def _base_names(files) -> set[str]:
    """The base names of the files an event touched (its ext's entries, path first): the touch index's keys."""
    return {f[0].rsplit("/", 1)[-1] for f in files}


def _remove_sorted(seqs: list[int], seq: int) -> None:
    i = bisect.bisect_left(seqs, seq)
    if i < len(seqs) and seqs[i] == seq:
        del seqs[i]


class RelationIndex:
    """Incoming edges: target message id -> list of (type, source message id)."""

    def __init__(self) -> None:
        self.incoming: dict[str, list[tuple[str, str]]] = {}

    def add(self, msg: Message) -> None:
        self.add_edges(msg.message_id, msg.relations)

    def add_edges(self, mid: str, relations) -> None:
        """``mid``'s outgoing edges: (type, target) pairs."""
        for rtype, target in relations:
            self.incoming.setdefault(target, []).append((rtype, mid))

    def remove(self, msg: Message) -> None:
        for rtype, target in msg.relations:
            edges = self.incoming.get(target)
            if edges is None:
                continue
            try:
                edges.remove((rtype, msg.message_id))
            except ValueError:
                pass
            if not edges:
                del self.incoming[target]

    def incoming_of(self, message_id: str) -> list[tuple[str, str]]:
        return self.incoming.get(message_id, [])

    def size_bytes(self) -> int:
        n = sys.getsizeof(self.incoming)
        for key, edges in self.incoming.items():
            n += sys.getsizeof(key) + sys.getsizeof(edges) + len(edges) * 64  # a 2-tuple is 56 bytes + ref
        return n


LOAD_STEP = 64   # what a start left for idle time: items made between looks at the clock and the socket (~0.3 ms)


class TouchIndex:
    """Events that touched files (tool calls that read or changed them), by the file's base name:
    file_attention looks a path tail up here and checks the few candidates it finds.

    A start does not build it (355k events with files at five million: ~0.4 s before the first
    request): ``load_later`` takes the table's events with files, and the request loop loads them a
    slice at a time while it is idle (``load_step``); a lookup meanwhile finishes the load first. The
    load reads each event's files as the table has them when it gets there, and never adds a seq a
    list holds already, so the changes made meanwhile (``add`` and ``remove``, as always) stand."""

    def __init__(self) -> None:
        self.by_name: dict[str, list[int]] = {}
        self._pending: list[int] | None = None    # the seqs still to load, ascending
        self._source: Mapping[int, tuple] | None = None   # seq -> its ext (files at [3]): the table's ExtFiles
        self._at = 0

    @staticmethod
    def _names(msg: Message) -> set[str]:
        return _base_names(msg.ext[3]) if msg.ext is not None and msg.ext[3] else set()

    def add(self, msg: Message) -> None:
        for name in self._names(msg):
            _insort(self.by_name.setdefault(name, []), msg.seq)

    def load_later(self, ext_files: Mapping[int, tuple]) -> None:
        """Load the events of ``ext_files`` (seq -> ext with files: the table's own ExtFiles, read as it
        is when each step gets there) into an empty index, in ``load_step``s."""
        self._pending, self._source, self._at = sorted(ext_files), ext_files, 0
        if not self._pending:
            self._pending = self._source = None

    @property
    def pending(self) -> bool:
        return self._pending is not None

    def load_step(self, deadline: float | None, interrupted: Callable[[], bool] | None = None) -> bool:
        """Load the next events of ``load_later`` until the monotonic clock passes ``deadline`` (None:
        all of them) or ``interrupted()`` says a request waits (both asked every LOAD_STEP events).
        True while some remain."""
        seqs, source, by_name = self._pending, self._source, self.by_name
        if seqs is None:
            return False
        at, n = self._at, len(seqs)
        while at < n:
            for seq in seqs[at:at + LOAD_STEP]:
                try:
                    ext = source.get(seq)
                except (ExtDamaged, TextDamaged) as exc:   # (its record in the log damaged as well)
                    LOG.error("the touch index leaves out an event: %s", exc)
                    continue
                if ext is None:   # deleted meanwhile, or its files gone
                    continue
                for name in _base_names(ext[3]):
                    # (a seq added meanwhile may lie past it, or be this one: ``add`` of an update)
                    _insort_once(by_name.setdefault(name, []), seq)
            at += LOAD_STEP
            if deadline is not None and (time.monotonic() > deadline or (interrupted is not None and interrupted())):
                break
        self._at = at
        if at < n:
            return True
        self._pending = self._source = None
        return False

    def add_files(self, seq: int, files) -> None:
        """The event at ``seq`` touched ``files`` (its ext's entries, path first)."""
        for name in _base_names(files):
            _insort(self.by_name.setdefault(name, []), seq)

    def remove(self, msg: Message) -> None:
        for name in self._names(msg):
            seqs = self.by_name.get(name)
            if seqs is not None:
                _remove_sorted(seqs, msg.seq)
                if not seqs:
                    del self.by_name[name]

    def candidates(self, name: str) -> list[int]:
        if self._pending is not None:
            self.load_step(None)
        return self.by_name.get(name, [])

    def size_bytes(self) -> int:
        return sys.getsizeof(self.by_name) + sum(sys.getsizeof(k) + sys.getsizeof(v) for k, v in self.by_name.items())


# get_system_health's figures for these indexes walk every session and every relation target: tens of
# milliseconds at 100k sessions, on the request loop, for each call. They are kept against the store's
# version and, for stores over HEALTH_EXACT_SESSIONS sessions, recomputed at most once a HEALTH_REFRESH_S.
HEALTH_EXACT_SESSIONS = 1000
HEALTH_REFRESH_S = 1.0
HEALTH_SAMPLE = 256   # sessions a health call makes while a start's are still pending (IndexSizes)


class IndexSizes:
    """(history index bytes, relation index bytes) for health, without an O(sessions) walk per call."""

    __slots__ = ("version", "at", "value", "relations_at", "relations_value")

    def __init__(self) -> None:
        self.version: object = None
        self.at = float("-inf")
        self.value = (0, 0)
        self.relations_at = float("-inf")   # while a start's sessions are still being made
        self.relations_value = 0

    def get(self, version: object, sessions: dict[str, Session], relations: RelationIndex) -> tuple[int, int]:
        now = time.monotonic()
        if version != self.version and (len(sessions) <= HEALTH_EXACT_SESSIONS or now - self.at >= HEALTH_REFRESH_S):
            # (a start's sessions are not all made for this: a sample of them is, scaled up, and the
            # figure is not kept while some are still to be made)
            if getattr(sessions, "pending", False):
                sessions.make_some(HEALTH_SAMPLE)
                sample = list(itertools.islice(dict.items(sessions), HEALTH_SAMPLE))
                history = sum(sys.getsizeof(k) + s.size_bytes() for k, s in sample) * len(sessions) // len(sample)
                if now - self.relations_at >= HEALTH_REFRESH_S:   # (that walk is rate-limited all the same)
                    self.relations_at, self.relations_value = now, relations.size_bytes()
                return (history + sys.getsizeof(sessions), self.relations_value)
            history = sys.getsizeof(sessions) + sum(sys.getsizeof(k) + s.size_bytes() for k, s in sessions.items())
            self.value = (history, relations.size_bytes())
            self.version, self.at = version, now
        return self.value


class SessionMap(dict):
    """sid -> ``Session``, where the sessions a start found are made when first asked for.

    Making a ``Session`` of each of a store's sessions at start (a Python object, its seqs and turn
    starts as arrays) was ~0.6 s of a five-million-event start (91k sessions). ``sessions_from_table``
    computes every session's fields in numpy and leaves them here, *pending*: a lookup of one
    (``[]``, ``get``, ``in``) makes that one, and the request loop makes the rest a slice at a time
    while it is idle (``load_step``, as the touch index loads); whatever walks them all (iteration,
    ``items``, ``values``) makes the rest first. A session put or deleted meanwhile is simply no
    longer pending."""

    __slots__ = ("_pending", "_make")

    def __init__(self, pending: dict[str, int] | None = None, make: Callable[[str, int], Session] | None = None) -> None:
        super().__init__()
        self._pending = pending or None   # sid -> its group in make's arrays
        self._make = make

    @property
    def pending(self) -> bool:
        return self._pending is not None

    def __missing__(self, sid: str) -> Session:
        pending = self._pending
        if pending is None or sid not in pending:
            raise KeyError(sid)
        s = self._make(sid, pending.pop(sid))
        dict.__setitem__(self, sid, s)
        if not pending:
            self._done()
        return s

    def _done(self) -> None:
        self._pending = self._make = None

    def load_step(self, deadline: float | None, interrupted: Callable[[], bool] | None = None) -> bool:
        """Make pending sessions until the monotonic clock passes ``deadline`` (None: all of them) or
        ``interrupted()`` says a request waits (both asked every LOAD_STEP sessions). True while some remain."""
        pending, make, put = self._pending, self._make, dict.__setitem__
        while pending:
            for _ in range(min(LOAD_STEP, len(pending))):
                sid, g = pending.popitem()
                put(self, sid, make(sid, g))
            if deadline is not None and pending and (time.monotonic() > deadline
                                                     or (interrupted is not None and interrupted())):
                return True
        if self._pending is not None:
            self._done()
        return False

    def _all(self) -> None:
        if self._pending is not None:
            self.load_step(None)

    def make_some(self, n: int) -> None:
        """Make up to ``n`` pending sessions (a sample for an estimate)."""
        if self._pending is not None:
            for sid in list(itertools.islice(self._pending, n)):
                self[sid]

    def pending_sids(self) -> list[str]:
        return list(self._pending) if self._pending is not None else []

    def get(self, sid: str, default=None):
        s = dict.get(self, sid)
        if s is None and self._pending is not None and sid in self._pending:
            return self[sid]
        return default if s is None else s

    def __contains__(self, sid: object) -> bool:
        return dict.__contains__(self, sid) or (self._pending is not None and sid in self._pending)

    def __len__(self) -> int:
        return dict.__len__(self) + (len(self._pending) if self._pending is not None else 0)

    def __setitem__(self, sid: str, session: Session) -> None:
        if self._pending is not None:
            self._pending.pop(sid, None)
        dict.__setitem__(self, sid, session)

    def __delitem__(self, sid: str) -> None:
        if self._pending is not None and sid in self._pending:
            del self._pending[sid]
            if not self._pending:
                self._done()
            return
        dict.__delitem__(self, sid)

    # whatever walks them all, or copies, makes the rest first
    def __iter__(self):
        self._all()
        return dict.__iter__(self)

    def keys(self):
        self._all()
        return dict.keys(self)

    def values(self):
        self._all()
        return dict.values(self)

    def items(self):
        self._all()
        return dict.items(self)

    def pop(self, sid: str, *default):
        if sid in self:
            s = self[sid]
            dict.__delitem__(self, sid)
            return s
        if default:
            return default[0]
        raise KeyError(sid)

    def setdefault(self, sid: str, default=None):
        if sid not in self:
            self[sid] = default
        return self[sid]

    def copy(self) -> dict[str, Session]:
        self._all()
        return dict(dict.items(self))

    def __eq__(self, other: object) -> bool:
        self._all()
        if isinstance(other, SessionMap):
            other._all()
        return dict.__eq__(self, other)

    __hash__ = None   # (as dict's)

    def __repr__(self) -> str:
        self._all()
        return dict.__repr__(self)

    def __reduce__(self):   # (copy, pickle: a plain dict of every session)
        self._all()
        return (dict, (dict(dict.items(self)),))

    def __reversed__(self):
        self._all()
        return dict.__reversed__(self)

    def __ne__(self, other: object) -> bool:
        return not self == other

    def __or__(self, other):
        self._all()
        return dict(dict.items(self)) | other

    def __ror__(self, other):
        self._all()
        return other | dict(dict.items(self))

    def __ior__(self, other):
        self.update(other)
        return self

    def popitem(self):
        self._all()
        return dict.popitem(self)

    def clear(self) -> None:
        self._done()
        dict.clear(self)

    def update(self, *args, **kw) -> None:
        for sid, s in dict(*args, **kw).items():
            self[sid] = s


class SessionKeys(dict):
    """``handles.session_digest(sid)`` -> sid, for the history interface's session ids; at start the
    digests (a SHA-256 each: ~0.1 s at 91k sessions) are computed by the request loop's idle slices
    (``later``, ``load_step``), and a lookup meanwhile computes the rest first."""

    __slots__ = ("_pending", "_alive")

    def __init__(self) -> None:
        super().__init__()
        self._pending: list[str] | None = None
        self._alive: Callable[[str], bool] | None = None

    def later(self, sids: list[str], alive: Callable[[str], bool]) -> None:
        """Add ``sids``' digests in ``load_step``s, each only if ``alive(sid)`` then (a session deleted
        meanwhile has none)."""
        self._pending, self._alive = (sids, alive) if sids else (None, None)

    @property
    def pending(self) -> bool:
        return self._pending is not None

    def load_step(self, deadline: float | None, interrupted: Callable[[], bool] | None = None) -> bool:
        pending, alive = self._pending, self._alive
        while pending:
            for sid in pending[-LOAD_STEP:]:
                if alive(sid):
                    dict.__setitem__(self, session_digest(sid), sid)
            del pending[-LOAD_STEP:]
            if deadline is not None and pending and (time.monotonic() > deadline
                                                     or (interrupted is not None and interrupted())):
                return True
        self._pending = self._alive = None
        return False

    def get(self, digest: bytes, default=None):
        if self._pending is not None:
            self.load_step(None)
        return dict.get(self, digest, default)


def sessions_from_table(table) -> SessionMap:
    """Every session's ``Session``, from a freshly loaded MessageTable (storaged/columns.py): the
    grouping, bounds and counts in numpy, none a message; each session made on first use or by the
    request loop's idle slices (``SessionMap``)."""
    from .columns import ETYPE_CODE
    live = table.live_seqs()
    if not len(live):
        return SessionMap()
    numbers = table.column("session", live)
    order = np.argsort(numbers, kind="stable")       # by session, then seq (live is ascending)
    seqs, numbers = live[order], numbers[order]
    starts = np.flatnonzero(np.r_[True, numbers[1:] != numbers[:-1]])
    # per session: sums over each run of rows (reduceat at the runs' starts), no per-row group number;
    # each field read in seq order (a run of rows is copied as a slice) and then put in session order
    ts = table.column("ts", live)[order]
    min_ts, max_ts = np.minimum.reduceat(ts, starts).tolist(), np.maximum.reduceat(ts, starts).tolist()
    kind = ((table.column("codes", live) >> 16) & 0xFF).astype(np.uint8)[order]
    kind_counts = np.stack([np.add.reduceat(kind == k, starts, dtype=np.int64)
                            for k in range(len(L.MEMORY_KINDS))], axis=1).tolist()
    etype = np.frombuffer(table.etype, np.uint8)[seqs]   # a copy; the view goes with this line
    calls = etype == ETYPE_CODE[TOOL_CALL]
    tool_calls = np.add.reduceat(calls, starts, dtype=np.int64).tolist()
    web_numbers = [n for t, n in table.tools.number.items() if t in WEB_SEARCH_TOOLS]
    web = calls & np.isin(table.column("tool", live)[order], web_numbers)
    web_calls = np.add.reduceat(web, starts, dtype=np.int64).tolist()
    user = etype == ETYPE_CODE[USER_INPUT]
    turn_seqs = seqs[user]
    turn_at = (np.r_[0, np.cumsum(np.add.reduceat(user, starts, dtype=np.int64))] * 8).tolist()
    group_sids = [table.sids[n - 1] for n in numbers[starts].tolist()]
    bounds = (np.r_[starts, len(seqs)] * 8).tolist()
    all_seqs, all_turns = seqs.astype("<i8", copy=False).tobytes(), turn_seqs.astype("<i8", copy=False).tobytes()
    summarised: dict[str, list[int]] = {}
    for seq in sorted(table.summary):
        summarised.setdefault(table.session_id(seq), []).append(seq)
    new = Session.__new__

    def make(sid: str, g: int) -> Session:
        # its fields set on a bare instance, its seqs sliced out of one bytes object (~6 µs; through
        # __init__ and numpy slices it was twice that)
        s = new(Session)
        s.sid = sid
        s.seqs = a = array("q")
        a.frombytes(all_seqs[bounds[g]:bounds[g + 1]])
        s.turn_seqs = a = array("q")
        a.frombytes(all_turns[turn_at[g]:turn_at[g + 1]])
        s.kind_counts = kind_counts[g]
        s.summary_seqs = summarised.get(sid, [])
        s.min_ts, s.max_ts = min_ts[g], max_ts[g]
        s.tool_calls, s.web_calls = tool_calls[g], web_calls[g]
        s.epoch = 0
        return s

    return SessionMap(dict(zip(group_sids, range(len(group_sids)))), make)
