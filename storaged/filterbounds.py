"""Window bounds over the docs a filter accepts, made when a filtered query first needs them.

Why: a segment's window bounds (storaged/segment.py) are over every doc of a window. A filter that
keeps a minority of a list's postings — search_sessions' default event types keep prompts and
answers, while tool output holds most of a common word's postings — finds its acceptable docs
scoring far below those bounds, so block-max pruning reads nearly every window and the window kernel
hands the query to the array kernel (~30 ms a query at 5M events, every one of them). Bounds over the
accepted docs alone prune a filtered query as the segment's prune an unfiltered one.

They are made from a long list's postings, one pass in C over the list (about what the array
kernel spends on it once), and kept a byte a window in a cache of bounded size: the lists that have
bounds are each segment's few hundred most common words, the ones queries keep coming back to.

Soundness, as for a segment's bounds: a window's bound is the highest impact of an accepted posting
there at the impact table of its making (the field's average length then), in 255ths of the row's
highest, rounded up; the kernel multiplies it by the drift of the field's average since. What a slot
holds never changes while it is alive (an update removes the doc's slot and indexes it again in a new
one), so neither does whether its doc passes an event-type filter; a slot that dies only lowers what a
window can score. The key holds the filter's own key anyway (``cache_key``: its event types and the
message table's etype epoch, which moves if a live message ever changes type), so a bound is never
used for any filter but the one it was made for.
"""
from __future__ import annotations

from collections import OrderedDict
from typing import Callable

import numpy as np

# the bytes of bound rows kept (each a byte a window of its segment: ~6 KB at 5M events); past it,
# the least recently used go. Enough for every bounded list of a 5M-event index under one filter.
CACHE_BYTES = 48 << 20
# a kept row's Python objects beside its bytes (its key, tuple, array header; measured ~360 B)
ROW_OVERHEAD = 400
# filters whose verdict by slot is kept (a byte a slot: 5 MB at 5M events each)
MASKS = 4


class FilteredBounds:
    """What a filter keeps, by slot, and bound rows over it: (segment field, bound row, filter key)
    → the row's windows bounded over the filter's docs."""

    __slots__ = ("cap", "_rows", "_bytes", "_masks", "made")

    def __init__(self, cap: int = CACHE_BYTES) -> None:
        self.cap = cap
        self._rows: OrderedDict[tuple, tuple[float, float, np.ndarray]] = OrderedDict()
        self._bytes = 0
        self._masks: OrderedDict[tuple, list] = OrderedDict()  # fkey → [buffer, slots made]
        self.made = 0  # rows made (not found): what a test or a bench reads

    @property
    def nbytes(self) -> int:
        return self._bytes + sum(buf.nbytes for buf, _ in self._masks.values())

    def clear(self) -> None:
        """Forget everything: the index's slots were numbered again (SearchIndex.compact, which only
        renumbers an index without segments; a load makes a new index, and a new FilteredBounds)."""
        self._rows.clear()
        self._bytes = 0
        self._masks.clear()

    def covered(self, fkey: tuple) -> int:
        """The slots whose verdicts under ``fkey`` are made (the first ones)."""
        got = self._masks.get(fkey)
        return 0 if got is None else got[1]

    def kept(self, fkey: tuple, slot_doc: np.ndarray, accept_docs: Callable[[np.ndarray], np.ndarray],
             upto: int | None = None) -> np.ndarray:
        """Whether ``accept_docs`` keeps each slot's doc (``slot_doc``: every slot's, as the index
        has them now), a bool a slot; made for the slots it has not seen (all, the first time: ~50 ms
        at 5M events, which the daemon's idle steps do ahead for the usual filter: ``upto``, the
        slots to cover at least) and kept, in a buffer that grows by doubling (a write's new slots
        cost their own verdicts, not a copy of the rest). A slot's doc never changes, nor its type
        while the slot lives (the key's epoch moves if a live message's does), so a verdict stays
        true; a dead slot is the kernel's to drop."""
        got = self._masks.get(fkey)
        n = len(slot_doc) if upto is None else min(upto, len(slot_doc))
        if got is not None:
            self._masks.move_to_end(fkey)
            if got[1] >= n:
                return got[0][:got[1]]
        else:
            got = self._masks[fkey] = [np.zeros(0, bool), 0]
            while len(self._masks) > MASKS:
                self._masks.popitem(last=False)
        buf, lo = got
        if n > len(buf):
            grown = np.zeros(max(n, 2 * len(buf)), bool)
            grown[:lo] = buf[:lo]
            got[0] = buf = grown
        buf[lo:n] = accept_docs(slot_doc[lo:n].astype(np.int64))
        got[1] = n
        return buf[:n]

    def get(self, ident: tuple, row: int, fkey: tuple) -> tuple[float, float, np.ndarray] | None:
        """(the average length it was made at, the row's highest bound, its bytes a window), or None."""
        key = (ident, row, fkey)
        got = self._rows.get(key)
        if got is not None:
            self._rows.move_to_end(key)
        return got

    def put(self, ident: tuple, row: int, fkey: tuple, q_now: float, top: float, cells: np.ndarray
            ) -> tuple[float, float, np.ndarray]:
        """Keep a row made at average length ``q_now`` (accepted_maxima's (highest, bytes)); the
        least recently used go past the cap. Returns what get() will."""
        got = self._rows[(ident, row, fkey)] = (q_now, top, cells)
        self.made += 1
        self._bytes += cells.nbytes + ROW_OVERHEAD
        while self._bytes > self.cap and len(self._rows) > 1:
            _, (_, _, old) = self._rows.popitem(last=False)
            self._bytes -= old.nbytes + ROW_OVERHEAD
        return got


def accepted_maxima(slots: np.ndarray, keys: np.ndarray, impacts: np.ndarray, kept: np.ndarray,
                    shift: int, w_lo: int, n_win: int) -> tuple[float, np.ndarray]:
    """(highest, per window in 255ths of it rounded up as u8) of ``impacts[keys]`` over the postings
    (``slots`` ascending, all in windows [w_lo, w_lo + n_win)) whose slot ``kept`` marks;
    (0.0, zeros) when it keeps none. The highest and each ratio are nudged up a hair so that
    rounding never puts a window's bound below an impact it bounds."""
    cells = np.zeros(n_win, np.uint8)
    at = np.flatnonzero(kept[slots])
    if not len(at):
        return 0.0, cells
    values = impacts[keys[at]]
    win = (slots[at] >> shift).astype(np.int64) - w_lo
    edge = np.flatnonzero(np.concatenate(([True], win[1:] != win[:-1])))
    best = np.maximum.reduceat(values, edge)
    top = float(best.max()) * (1.0 + 1e-9)
    if top <= 0.0:
        return 0.0, cells
    # the ratio nudged up too, as the segment writer does: a window whose highest sits at a rounding
    # edge of ceil still gets the step above it
    cells[win[edge]] = np.minimum(np.ceil(best * (255.0 / top) * (1.0 + 1e-9)), 255.0)
    return top, cells
