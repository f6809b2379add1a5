"""Where a start's time goes: ``Store.open`` of a data directory in this process, each of its big steps
timed (bench/SPIKES.md parts 9 and 11).

    python -m bench.open_profile DATA_DIR [--repeat 3] [--gc]

The collector is off, as the daemon's loader has it (``Server.load_in_background``), unless ``--gc``.
Each run opens the store, prints the steps' seconds (a step's time includes the steps it calls),
the whole, and the process's resident memory, then closes it. The open does what a start does (it
may cut a torn tail or replace a snapshot of an earlier format): run it on a stopped daemon's directory
(a bench.scale store's ``DIR/data``), never a running one's. The page cache is whatever the machine
holds: a first run after a reboot reads the files from disk.
"""
from __future__ import annotations

import argparse
import functools
import gc
import sys
import time
from typing import Any, Callable

from storaged import columns, indexes, ingeststate, search, snapshot
from storaged import store as store_mod

# (owner, attribute, label): the steps of a start from a snapshot, outermost first
STEPS: list[tuple[Any, str, str]] = [
    (store_mod.Store, "_replay", "replay (all of the open after the log is mapped)"),
    (snapshot.Reader, "__init__", "  snapshot reader (manifest, row segments' heads and tails)"),
    (search.SearchIndex, "load", "  search index load (segments mapped, per-slot tables)"),
    (store_mod.Store, "_load_snapshot_state", "  snapshot state"),
    (ingeststate.IngestState, "load", "    checkpoints"),
    (store_mod.Store, "_load_columns", "    rows and what is built of them"),
    (columns.MessageTable, "load_segments", "      message table"),
    (store_mod, "sessions_from_table", "      sessions"),
    (store_mod.Store, "_check_index_docs", "    index's per-slot docs checked"),
]


def _timed(fn: Callable, label: str, times: dict[str, float]) -> Callable:
    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        t0 = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            times[label] = times.get(label, 0.0) + time.perf_counter() - t0
    return wrapper


def _wrap(times: dict[str, float]) -> list[tuple[Any, str, Any]]:
    """Time each step; returns what to put back (``_unwrap``)."""
    saved = []
    for owner, name, label in STEPS:
        raw = owner.__dict__[name] if isinstance(owner, type) else getattr(owner, name)
        saved.append((owner, name, raw))
        if isinstance(raw, classmethod):
            setattr(owner, name, classmethod(_timed(raw.__func__, label, times)))
        else:
            setattr(owner, name, _timed(raw, label, times))
    return saved


def _unwrap(saved: list[tuple[Any, str, Any]]) -> None:
    for owner, name, raw in saved:
        setattr(owner, name, raw)


def _rss() -> str:
    with open("/proc/self/status") as f:
        fields = dict(line.split(":", 1) for line in f if line.startswith(("VmHWM", "RssAnon", "RssFile")))
    return ", ".join(f"{k} {int(v.split()[0]) / 1024:,.0f} MiB" for k, v in fields.items())


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("data_dir")
    p.add_argument("--repeat", type=int, default=1, help="opens in a row (the first may read from disk)")
    p.add_argument("--gc", action="store_true", help="keep the cyclic collector on")
    a = p.parse_args(argv)
    if not a.gc:
        gc.disable()
    times: dict[str, float] = {}
    saved = _wrap(times)
    try:
        _runs(a.data_dir, a.repeat, times)
    finally:
        _unwrap(saved)
        if not a.gc:
            gc.enable()


def _runs(data_dir: str, repeat: int, times: dict[str, float]) -> None:
    for run in range(repeat):
        times.clear()
        t0 = time.perf_counter()
        store = store_mod.Store.open(data_dir)
        whole = time.perf_counter() - t0
        print(f"run {run + 1}: Store.open {whole:.3f} s — {len(store.table):,} messages, "
              f"{len(store.sessions):,} sessions, snapshot_valid={store.snapshot_valid}, "
              f"replayed {store.scan_result.records:,} records")
        for _, _, label in STEPS:
            if label in times:
                print(f"  {times[label]:7.3f}  {label}")
        print(f"  {_rss()}")
        store.close()
        del store
        gc.collect()   # (not timed) the store just closed, freed before the next open measures its own
    sys.stdout.flush()


if __name__ == "__main__":
    main()
