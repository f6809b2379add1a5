"""The data directories earlier releases wrote, kept as fixtures, and how a test gets a working copy.

``store-log2-snap3`` was written by a real daemon of the release before issue 15's format change,
``store-log2-snap4`` by the release before the search index's segments, ``store-log2-snap5`` by the
release before row segments, ``store-log2-snap6`` by the release before the index segments held their slots'
docs and lengths, ``store-log2-rows2`` by the release before the narrow row, ``store-log2-rows3`` by the release before
the packed ext entries (row segments of version 3; ``fixtures/make_store.py`` made them and says how); ``expected.json`` beside each is what that daemon answered. ``store-v1`` is release 0.1's (its ``expected.json`` is the messages' ``to_dict`` list). Both
the in-process and the process tests read them from here, so they check the same thing.
"""
from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

from . import FIXTURES

STORE = FIXTURES / "store-log2-snap3"
STORE_SNAP4 = FIXTURES / "store-log2-snap4"  # the release before the search index's segments
STORE_SNAP5 = FIXTURES / "store-log2-snap5"  # the release before row segments (rows inline, index segments)
STORE_SNAP6 = FIXTURES / "store-log2-snap6"  # the release before index segments held their slots' docs and lengths
STORE_ROWS2 = FIXTURES / "store-log2-rows2"  # the release before the narrow row (row segments of version 2)
STORE_ROWS3 = FIXTURES / "store-log2-rows3"  # the release before the packed ext entries (row segments of version 3)
STORE_0_1 = FIXTURES / "store-v1"
EXPECTED: dict[str, Any] = json.loads((STORE / "expected.json").read_text())
# each store made by make_store.py with a release, and what that release answered
RELEASES: dict[str, tuple[Path, dict[str, Any]]] = {
    p.name: (p, json.loads((p / "expected.json").read_text())) for p in (STORE, STORE_SNAP4, STORE_SNAP5, STORE_SNAP6, STORE_ROWS2,
                                                                           STORE_ROWS3)
}
NOT_STORE = ("expected.json",)   # what a fixture directory holds beside the store


def copy_store(src: Path, dst: Path) -> Path:
    """The fixture as a daemon finds a data directory: a private directory (0700) of private files (0600)."""
    shutil.copytree(src, dst, ignore=shutil.ignore_patterns(*NOT_STORE))
    os.chmod(dst, 0o700)
    for name in os.listdir(dst):
        os.chmod(dst / name, 0o600)
    return dst


def without_event(m: dict[str, Any]) -> dict[str, Any]:
    """A message as the memory interface (and ``Message.to_dict``) has it; export adds the event facts."""
    return {k: v for k, v in m.items() if k != "event"}
