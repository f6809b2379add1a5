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

A row keeps the positions of the list's kept postings beside its bounds (and their count in each
window): the window kernel then gathers the kept postings of the windows it reads, not every posting
there (the filter keeps ~7% of a 5M-event index's postings, ~26% of its docs). Made in the same pass.
"""
from __future__ import annotations

from collections import OrderedDict
from typing import Callable, NamedTuple

import numpy as np

# the bytes of rows kept (two bytes a window of its segment, ~10 KB at 5M events, and four a kept
# posting); past it, the least recently used go. At 5M events every bounded list under the usual
# filter is ~135 MB (17M kept postings): this holds the lists a query mix keeps coming back to.
CACHE_BYTES = 96 << 20
# a kept row's Python objects beside its bytes (its key, tuple, array headers; measured ~500 B)
ROW_OVERHEAD = 600
# filters whose verdict by slot is kept (a byte a slot: 5 MB at 5M events each)
MASKS = 4


class KeptRow(NamedTuple):
    """A bounded list's row over a filter's docs (``accepted_row``)."""
    q_then: float       # the field's average length it was made at
    top: float          # the highest impact of a kept posting (0.0: none kept)
    cells: np.ndarray   # u8 a window: its highest, in 255ths of top, rounded up
    at: np.ndarray      # u32: the kept postings' positions in the list, ascending
    counts: np.ndarray  # a window: how many of them it holds

    @property
    def nbytes(self) -> int:
        return self.cells.nbytes + self.at.nbytes + self.counts.nbytes + ROW_OVERHEAD


class FilteredBounds:
    """What a filter keeps, by slot, and bound rows over it: (segment field, bound row, filter key)
    → the row's windows bounded over the filter's docs."""

    __slots__ = ("cap", "_rows", "_bytes", "_masks", "made")

    def __init__(self, cap: int = CACHE_BYTES) -> None:
        self.cap = cap
        self._rows: OrderedDict[tuple, KeptRow] = OrderedDict()
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

    def get(self, ident: tuple, row: int, fkey: tuple) -> KeptRow | None:
        key = (ident, row, fkey)
        got = self._rows.get(key)
        if got is not None:
            self._rows.move_to_end(key)
        return got

    def put(self, ident: tuple, row: int, fkey: tuple, got: KeptRow) -> KeptRow:
        """Keep a row (``accepted_row``'s); the least recently used go past the cap."""
        key = (ident, row, fkey)
        old = self._rows.pop(key, None)
        if old is not None:
            self._bytes -= old.nbytes
        self._rows[key] = got
        self.made += 1
        self._bytes += got.nbytes
        while self._bytes > self.cap and len(self._rows) > 1:
            _, old = self._rows.popitem(last=False)
            self._bytes -= old.nbytes
        return got


def accepted_row(slots: np.ndarray, keys: np.ndarray, impacts: np.ndarray, kept: np.ndarray,
                 shift: int, w_lo: int, n_win: int, q_now: float) -> KeptRow:
    """The row of the list whose postings are ``slots`` (ascending, all in windows [w_lo, w_lo +
    n_win)) and ``keys``, over the slots ``kept`` marks, at impact table ``impacts`` (made at average
    length ``q_now``): per window the highest of ``impacts[keys]`` in 255ths of the row's highest,
    rounded up as u8 (0.0 and zeros when it keeps none), the kept postings' positions and their count
    in each window. The highest and each ratio are nudged up a hair so that rounding never puts a
    window's bound below an impact it bounds."""
    cells = np.zeros(n_win, np.uint8)
    at = np.flatnonzero(kept[slots]).astype(np.uint32)
    counts_type = np.uint8 if shift < 8 else np.uint32  # a list holds one posting a slot
    if not len(at):
        return KeptRow(q_now, 0.0, cells, at, np.zeros(n_win, counts_type))
    values = impacts[keys[at]]
    win = (slots[at] >> shift).astype(np.int64) - w_lo
    counts = np.bincount(win, minlength=n_win).astype(counts_type)
    edge = np.flatnonzero(np.concatenate(([True], win[1:] != win[:-1])))
    best = np.maximum.reduceat(values, edge)
    top = float(best.max()) * (1.0 + 1e-9)
    if top <= 0.0:
        return KeptRow(q_now, 0.0, cells, at, counts)
    # the ratio nudged up too, as the segment writer does: a window whose highest sits at a rounding
    # edge of ceil still gets the step above it
    cells[win[edge]] = np.minimum(np.ceil(best * (255.0 / top) * (1.0 + 1e-9)), 255.0)
    return KeptRow(q_now, top, cells, at, counts)
