"""What a snapshot's manifest is made of: ``python -m bench.manifest_size DATA_DIR``.

A snapshot rewrites its manifest whole every time (storaged/snapshot.py), so whatever grows with the
store in it is written again at every background snapshot. This prints the msgpack size of the manifest's
metadata and of the search dump, part by part (the parts over 1 KB), to see what that is.
"""
from __future__ import annotations

import os
import sys

import msgpack

from storaged import layout, snapshot
from storaged.fileio import FileIO


def _size(obj) -> int:
    return len(msgpack.packb(obj, use_bin_type=True))


def main(argv: list[str] | None = None) -> None:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        raise SystemExit("usage: python -m bench.manifest_size DATA_DIR")
    path = os.path.join(args[0], layout.SNAPSHOT)
    reader = snapshot.Reader(FileIO(), path)
    try:
        meta, dump = reader.meta, reader.search_dump
        print(f"snapshot file {os.path.getsize(path):,} bytes")
        print(f"meta {_size(meta):,} bytes; parts over 1 KB: "
              f"{ {k: _size(v) for k, v in meta.items() if _size(v) > 1024} }")
        if isinstance(dump, dict):
            print(f"search dump {_size(dump):,} bytes ({dump.get('format')}); parts over 1 KB: "
                  f"{ {k: _size(v) for k, v in dump.items() if k != 'fields' and _size(v) > 1024} }")
            for name, field in zip(("content", "summary", "tags"), dump.get("fields", [])):
                print(f"  {name}: { {k: _size(v) for k, v in field.items() if _size(v) > 1024} }")
    finally:
        reader.close()


if __name__ == "__main__":
    main()
