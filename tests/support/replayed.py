"""A store's data directory copied without its snapshot and segments: a start of the copy replays the
whole log, which is what any snapshot-loaded state must equal."""
from __future__ import annotations

import os
import shutil


def replay_copy(data_dir: str, dst: str) -> str:
    """Copy ``data_dir`` to ``dst`` (replaced if there) without the snapshot and its segment files."""
    shutil.rmtree(dst, ignore_errors=True)
    shutil.copytree(data_dir, dst)
    for name in os.listdir(dst):
        if name == "snapshot" or name.endswith(".seg"):
            os.remove(os.path.join(dst, name))
    return dst
