"""The in-memory indexes besides search: per-session history and the relation graph.

History is a sorted list of creation sequence numbers per session (keyset pages are a bisect);
relations are stored on the message (outgoing) plus a reverse map for incoming edges.
"""
from __future__ import annotations

import bisect
import sys

from protocol import limits as L

from .model import Message

KIND_INDEX = {kind: i for i, kind in enumerate(L.MEMORY_KINDS)}


class Session:
    __slots__ = ("sid", "seqs", "kind_counts", "summary_seqs")

    def __init__(self, sid: str) -> None:
        self.sid = sid                     # the one copy of the id that this session's messages share
        self.seqs: list[int] = []          # live messages, creation order
        self.kind_counts = [0] * len(L.MEMORY_KINDS)
        self.summary_seqs: list[int] = []  # those of them with a summary, for representative_summary

    def add(self, msg: Message) -> None:
        _insort(self.seqs, msg.seq)
        self.kind_counts[KIND_INDEX[msg.kind]] += 1
        if msg.summary is not None:
            _insort(self.summary_seqs, msg.seq)

    def remove(self, msg: Message) -> None:
        _remove_sorted(self.seqs, msg.seq)
        self.kind_counts[KIND_INDEX[msg.kind]] -= 1
        if msg.summary is not None:
            _remove_sorted(self.summary_seqs, msg.seq)

    def size_bytes(self) -> int:
        return (sys.getsizeof(self) + sys.getsizeof(self.seqs) + sys.getsizeof(self.kind_counts)
                + sys.getsizeof(self.summary_seqs))


def _insort(seqs: list[int], seq: int) -> None:
    if not seqs or seqs[-1] < seq:  # the common case: a new message is the newest
        seqs.append(seq)
    else:
        bisect.insort(seqs, seq)


def _remove_sorted(seqs: list[int], seq: int) -> None:
    i = bisect.bisect_left(seqs, seq)
    if i < len(seqs) and seqs[i] == seq:
        del seqs[i]


class RelationIndex:
    """Incoming edges: target message id -> list of (type, source message id)."""

    def __init__(self) -> None:
        self.incoming: dict[str, list[tuple[str, str]]] = {}

    def add(self, msg: Message) -> None:
        for rtype, target in msg.relations:
            self.incoming.setdefault(target, []).append((rtype, msg.message_id))

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
