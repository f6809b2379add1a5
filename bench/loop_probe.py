"""How long the daemon's work holds its request loop, in-process, on a copy of a real store: the stalls
issue 15's "no request waits more than 50 ms behind another" is about, each measured where it happens.

    python -m bench.loop_probe --store DIR/data --corpus DIR [--batches 30] [--rebuild]

DIR is a ``bench.scale`` directory (its ``data`` store and its corpus). The store is copied to a
temporary directory beside it first (nothing in DIR is changed), opened the way the daemon opens it (no
cyclic GC during the load, the loaded structures frozen), then:

  imports   --batches extra corpus batches (fresh ids) imported the way the loop does it: the frame
            decoded, then validated and stored a slice at a time (``Server._import_slice``'s budget),
            an index step after each; the survivors of each full collection frozen as the server does.
            -> the worst steps by kind and the worst collections.
  rebuild   (--rebuild) the rebuild's worker forked as the daemon forks it (``compaction.run_child``),
            the loop meanwhile sleeping 1 ms at a time and polling for its exit (every gap over 50 ms
            is a time a request would have waited: the fork itself, or a machine too busy to run
            the loop), then the steps of ``read_result_steps`` timed (the longest with the line each
            stopped at) and ``compaction.install`` with ``discard`` (a turn of the loop each in the
            daemon, the collector off in each), then the moves (``Store.relocate_step``) step by step.

One run, a shared machine: figures are noisy; compare before and after in the same machine state.
"""
from __future__ import annotations

import argparse
import gc
import os
import shutil
import tempfile
import time
from typing import Any

from ulid import ULID

from bench import scale_corpus
from protocol import validation as V
from protocol.requests import paused_at
from protocol import wire
from storaged import children, compaction
from storaged.server import IMPORT_SLICE_S, RELOCATE_STEP
from storaged.store import Store


def _top(steps: list[tuple[str, float]], n: int = 8) -> list[tuple[str, float]]:
    return [(k, round(v * 1000, 1)) for k, v in sorted(steps, key=lambda s: -s[1])[:n]]


def probe_imports(store: Store, corpus: str, batches: int) -> dict[str, Any]:
    steps: list[tuple[str, float]] = []
    collections: list[tuple[int, float]] = []
    started = [0.0]
    freeze_due = [False]

    def on_gc(phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            started[0] = time.perf_counter()
            return
        collections.append((info["generation"], time.perf_counter() - started[0]))
        freeze_due[0] = freeze_due[0] or info["generation"] == 2

    def timed(kind: str, fn) -> Any:
        t0 = time.perf_counter()
        try:
            return fn()
        finally:
            steps.append((kind, time.perf_counter() - t0))
            if freeze_due[0]:
                freeze_due[0] = False
                gc.freeze()

    gc.callbacks.append(on_gc)
    try:
        for n, batch in enumerate(scale_corpus.batches(corpus, "extra")):
            if n >= batches:
                break
            batch = {**batch, "messages": [{**m, "message_id": str(ULID())} for m in batch["messages"]]}
            frame = wire.encode_request("import_messages", batch, str(ULID()))
            _, args, _, _ = timed("decode", lambda: wire.decode_envelope(frame))

            def job():
                req = yield from V.import_messages_steps(args)
                return (yield from store.import_steps(req))

            steps_left = job()

            def one_slice() -> bool:
                deadline = time.perf_counter() + IMPORT_SLICE_S
                try:
                    while time.perf_counter() < deadline:
                        next(steps_left)
                except StopIteration:
                    return False
                return True

            while timed("import slice", one_slice):
                pass
            timed("index step", lambda: store.index_step(time.monotonic() + 0.005))
    finally:
        gc.callbacks.remove(on_gc)
    return {"worst_steps_ms": _top(steps), "worst_collections_ms": [(g, round(s * 1000, 1)) for g, s in
                                                                     sorted(collections, key=lambda c: -c[1])[:8]]}


def probe_rebuild(store: Store) -> dict[str, Any]:
    """As the daemon does it (Server._start_rebuild, _finish_rebuild): the worker forked, the loop
    polling for its exit, then its result read and installed, then the moves."""
    def work() -> int:
        gc.disable()
        return compaction.run_child(store)

    t0 = time.perf_counter()
    pid = children.start(work)
    fork_s = time.perf_counter() - t0
    gaps: list[float] = []
    last = time.perf_counter()
    while children.reap(pid, block=False) is None:
        time.sleep(0.001)
        now = time.perf_counter()
        gaps.append(now - last)
        last = now
    prepare_s = time.perf_counter() - t0
    gc.disable()  # as Server._rebuild_exited and _finish_rebuild do, each in its own turn of the loop
    reading = compaction.read_result_steps(store)
    read_steps = []
    while True:
        t1 = time.perf_counter()
        try:
            next(reading)
        except StopIteration as done:
            kind, prepared = done.value
            read_steps.append((time.perf_counter() - t1, "the end"))
            break
        read_steps.append((time.perf_counter() - t1, paused_at(reading)))
    assert kind == "ok", prepared
    t1 = time.perf_counter()
    compaction.install(store, prepared, background=True)
    compaction.discard(store)  # in the same turn, as Server._finish_rebuild does
    install_s = time.perf_counter() - t1
    gc.enable()
    moves = []
    while True:
        t2 = time.perf_counter()
        more = store.relocate_step(RELOCATE_STEP)
        moves.append(time.perf_counter() - t2)
        if not more:
            break
    gaps.sort()
    return {"prepare_s": round(prepare_s, 1), "fork_ms": round(fork_s * 1000, 1), "probe_gaps": len(gaps),
            "gaps_over_50ms": sum(g > 0.05 for g in gaps), "gap_p95_ms": round(gaps[int(len(gaps) * 0.95)] * 1000, 1),
            "gap_max_ms": round(gaps[-1] * 1000, 1), "read_result_steps_ms": [round(x * 1000, 1) for x, _ in read_steps],
            "read_result_longest_steps": [(round(x * 1000, 1), where) for x, where in sorted(read_steps)[::-1][:5]],
            "install_ms": round(install_s * 1000, 1),
            "relocate_steps": len(moves), "relocate_step_max_ms": round(max(moves) * 1000, 1)}


def main(argv: list[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--store", required=True, help="a store's data directory (copied first, never changed)")
    ap.add_argument("--corpus", required=True, help="the bench.scale directory holding the corpus")
    ap.add_argument("--batches", type=int, default=30)
    ap.add_argument("--rebuild", action="store_true")
    a = ap.parse_args(argv)
    tmp = tempfile.mkdtemp(prefix="loop-probe-", dir=os.path.dirname(os.path.abspath(a.store)))
    try:
        copy = os.path.join(tmp, "data")
        shutil.copytree(a.store, copy, ignore=shutil.ignore_patterns("run", "LOCK"))
        gc.disable()
        store = Store.open(copy)
        gc.freeze()
        gc.enable()
        results = {"imports": probe_imports(store, a.corpus, a.batches)}
        if a.rebuild:
            results["rebuild"] = probe_rebuild(store)
        store.close()
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    for part, figures in results.items():
        print(f"{part}: {figures}")
    return results


if __name__ == "__main__":
    main()
