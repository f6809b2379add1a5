"""``convmem-storaged --salvage``: the explicit repair of a log damaged before its end.

The daemon never guesses over mid-log damage; this command does, on purpose: it keeps a copy of
the damaged file, reads every record whose checksum still holds (resynchronising after each
damaged stretch), applies them in order, and writes a clean compacted log and snapshot.
"""
from __future__ import annotations

import os
import time
from typing import Any

from . import compaction, layout
from .fileio import FileIO
from .store import Store


def salvage(data_dir: str, io: FileIO | None = None) -> dict[str, Any]:
    io = io or FileIO()
    store = Store.open(data_dir, io, salvage=True)
    try:
        if not store.salt:
            raise RuntimeError("the log header is unreadable, so no record can be verified; nothing was changed")
        damaged = os.path.join(store.dir, layout.damaged_copy_name(time.time()))
        io.write_file_atomic(damaged, bytes(io.read_all(store.log_path)))
        scan = store.scan_result
        result = compaction.rebuild(store)
    finally:
        store.close()
    return {
        "damaged_copy": damaged,
        "records_recovered": scan.records,
        "damaged_ranges": [[a, b] for a, b in scan.damage_ranges],
        "torn_tail": scan.torn_tail,
        "messages": result["messages_indexed"],
        "bytes_before": result["bytes_before"],
        "bytes_after": result["bytes_after"],
    }

