"""A store's data directory copied without its snapshot and segments: a start of the copy replays the
whole log, which is what any snapshot-loaded state must equal; and a start of a data directory for the
length of a ``with`` block (``opened``)."""
from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from contextlib import contextmanager

from storaged.store import Store


@contextmanager
def opened(data_dir: str) -> Iterator[Store]:
    """``Store.open(data_dir)``, closed when the block ends (what a test checks after a restart)."""
    s = Store.open(data_dir)
    try:
        yield s
    finally:
        s.close()


def replay_copy(data_dir: str, dst: str) -> str:
    """Copy ``data_dir`` to ``dst`` (replaced if there) without the snapshot and its segment files."""
    shutil.rmtree(dst, ignore_errors=True)
    shutil.copytree(data_dir, dst)
    for name in os.listdir(dst):
        if name == "snapshot" or name.endswith(".seg"):
            os.remove(os.path.join(dst, name))
    return dst
