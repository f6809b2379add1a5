"""The message table at scale: ``python -m bench.message_table [--rows N] [--dir D]``.

Fills a ``MessageTable`` (storaged/columns.py) with N synthetic agent events (random ULIDs, a session per
2,000 events, a tool_call_id on every tool call and result, the tags every ingested event carries), then
writes it as a version 2 base row segment and loads that back into an empty table, the way a start does.
Prints the table's memory a message, the segment's bytes a message, and the seconds of the write, the
segment's open (checksum included) and the load, the sessions built from it and an id lookup. No daemon,
no log: the rows' texts are never read, so this isolates what issue 15's memory and start goals spend on
message metadata.
"""
from __future__ import annotations

import argparse
import gc
import os
import random
import tempfile
import time

from storaged import snapshot
from storaged.columns import MessageTable
from storaged.fileio import FileIO
from storaged.indexes import sessions_from_table
from storaged.text import LogText

_CROCKFORD = "0123456789ABCDEFGHJKMNPQRSTVWXYZ"
_TYPES = ("user_input", "assistant_response", "tool_call", "tool_response", "reasoning")


def _row(seq: int, rnd: random.Random) -> list:
    etype = _TYPES[seq % len(_TYPES)]
    mid = "01J" + "".join(rnd.choice(_CROCKFORD) for _ in range(23))
    tool = etype.startswith("tool")
    return [mid, f"session-{seq // 2000}", seq, 1_700_000_000_000 + seq, "user" if etype == "user_input" else "assistant",
            [seq * 300, 40, 200], 1, 1_700_000_000_000 + seq, f"toolu_{seq:020d}" if tool else None,
            ["claude-code", "project"], "short", "conversation", 50, None, [], [], etype, "Bash" if tool else None,
            [False, 0, None, []] if etype == "tool_response" else None, 300]


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m bench.message_table")
    ap.add_argument("--rows", type=int, default=1_000_000)
    ap.add_argument("--dir", default=None, help="where the segment is written (default: a temporary directory)")
    a = ap.parse_args(argv)
    directory = a.dir or tempfile.mkdtemp(prefix="convmem-table-")
    src, rnd, n = LogText(FileIO()), random.Random(1), a.rows
    table = MessageTable()
    t = time.monotonic()
    for seq in range(1, n + 1):
        table.load_row(_row(seq, rnd), src)
    table.index_all_ids()
    print(f"{n:,} rows put in {time.monotonic() - t:.1f} s; table {table.memory_bytes() / n:.0f} bytes a message")
    probe = [table.message_id(seq) for seq in range(1, n + 1, max(1, n // 1000))]
    path = os.path.join(directory, snapshot.rows_name())
    t = time.monotonic()
    columns = table.segment_columns(table.live_seqs())
    snapshot.write_row_columns(FileIO(), path, columns, [])
    print(f"base segment written in {time.monotonic() - t:.2f} s, {os.path.getsize(path) / n:.0f} bytes a message")
    del columns, table
    gc.collect()
    try:
        t0 = time.monotonic()
        segment = snapshot._RowSegment(FileIO(), path)
        t1 = time.monotonic()
        loaded = MessageTable()
        loaded.load_segments([(segment.columns, segment.tail["dead"])], src)
        t2 = time.monotonic()
        sessions = sessions_from_table(loaded)
        t3 = time.monotonic()
        segment.close()
        print(f"start: open and checksum {t1 - t0:.2f} s, rows {t2 - t1:.2f} s, {len(sessions):,} sessions "
              f"{t3 - t2:.2f} s")
        t = time.perf_counter()
        found = sum(loaded.seq_of(mid) is not None for mid in probe)
        print(f"id lookups: {found} of {len(probe)} found, {(time.perf_counter() - t) / len(probe) * 1e6:.1f} µs each")
    finally:
        os.remove(path)


if __name__ == "__main__":
    main()
