"""A long crash loop: concurrent writers through the daemon protocol while the daemon is SIGKILLed
at random moments and restarted; then every acknowledged write, update and delete is checked.

    python -m bench.crash_loop [--kills 300] [--writers 4] [--seed 1] [--pace-ms 10] [--json out.json]

Prints one line: kills, acknowledged, lost, duplicated (the last two must be 0). Exit status 1 if
anything was lost or duplicated or a request went unanswered.

``crash_loop`` is also the engine of the test suite's crash loop (``tests/process/test_daemon_crashloop.py``
runs it with fewer kills): each writer has its own REQ socket and retries a request that timed out on a
new socket with the same request id (Lazy Pirate), so a write applied just before a kill is answered with
its first result instead of being stored twice; at the end every acknowledged effect is checked against
the stored state after one more restart.
"""
from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import sys
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

from .daemon import Client, Daemon, DaemonPool, NoReply, new_rid


class _Writer(threading.Thread):
    """One client: writes (each with a unique content token), some updates and deletes of its own
    acknowledged messages, every request retried Lazy-Pirate style with its request id until answered."""

    def __init__(self, k: int, endpoint: str, seed: int, stop: threading.Event, timeout_ms: int,
                 pace_s: float, op_deadline_s: float) -> None:
        super().__init__(name=f"writer-{k}", daemon=True)
        self.k = k
        self.endpoint = endpoint
        self.rng = random.Random(seed)
        self.stop = stop
        self.timeout_ms = timeout_ms
        self.pace_s = pace_s
        self.op_deadline_s = op_deadline_s
        self.live: dict[str, tuple[str, str, int]] = {}   # message_id → (session, content, revision)
        self.deleted: set[str] = set()
        self.writes = self.updates = self.deletes = 0
        self.retries = 0
        self.errors: list[str] = []
        self.n = 0

    def token(self) -> str:
        self.n += 1
        return f"tok-{self.k}-{self.n}-{self.rng.getrandbits(48):012x}"

    def _call(self, c: Client, op: str, args: dict[str, Any]) -> dict[str, Any] | None:
        try:
            # BUSY (the restarted daemon still loading) is retried like a timeout, same request id
            return c.call(op, args, rid=new_rid(), deadline=time.monotonic() + self.op_deadline_s, busy_retry=True)
        except NoReply as exc:
            self.errors.append(f"writer {self.k}: {exc}")
            return None

    def run(self) -> None:
        with Client(self.endpoint, timeout_ms=self.timeout_ms, retries=0) as c:
            while not self.stop.is_set() and not self.errors:
                r = self.rng.random()
                if r < 0.12 and self.live:
                    self.update(c)
                elif r < 0.2 and self.live:
                    self.delete(c)
                else:
                    self.write(c)
                if self.pace_s:
                    time.sleep(self.rng.uniform(0, 2 * self.pace_s))
            self.retries = c.resets

    def write(self, c: Client) -> None:
        session = f"cl-{self.k}-{self.rng.randrange(4)}"
        content = self.token()
        rep = self._call(c, "write_message", {"session_id": session, "role": self.rng.choice(["user", "assistant"]),
                                              "content": content})
        if rep is None:
            return
        if rep.get("status") != "OK" or rep["message"]["content"] != content:
            self.errors.append(f"write: unexpected reply {rep!r:.300}")
            return
        m = rep["message"]
        self.live[m["message_id"]] = (session, content, 1)
        self.writes += 1

    def update(self, c: Client) -> None:
        mid = self.rng.choice(list(self.live))
        session, _, rev = self.live[mid]
        content = self.token()
        rep = self._call(c, "update_message", {"message_id": mid, "content": content, "expected_revision": rev})
        if rep is None:
            return
        if rep.get("status") != "OK" or rep.get("changed") is not True or rep["message"]["revision"] != rev + 1 \
                or rep["message"]["content"] != content:
            self.errors.append(f"update: unexpected reply {rep!r:.300}")
            return
        self.live[mid] = (session, content, rev + 1)
        self.updates += 1

    def delete(self, c: Client) -> None:
        mid = self.rng.choice(list(self.live))
        rep = self._call(c, "delete_message", {"message_id": mid})
        if rep is None:
            return
        if rep != {"status": "OK"}:
            self.errors.append(f"delete: unexpected reply {rep!r:.300}")
            return
        del self.live[mid]
        self.deleted.add(mid)
        self.deletes += 1


def crash_loop(base_dir: str | os.PathLike, kills: int, writers: int = 4, seed: int = 1, min_gap_ms: int = 50,
               max_gap_ms: int = 400, timeout_ms: int = 500, pace_s: float = 0.002, op_deadline_s: float = 60.0,
               progress: Any = None) -> dict[str, Any]:
    """SIGKILL the daemon ``kills`` times (50–400 ms after each restart became ready) while writers
    run; then restart once more and check every acknowledged effect against the stored state.

    Returns the figures; ``lost`` and ``duplicated`` must be 0, ``errors`` empty.
    """
    rng = random.Random(seed)
    pool = DaemonPool(Path(base_dir))
    d = pool.new("d")
    t0 = time.monotonic()
    stop = threading.Event()
    ws: list[_Writer] = []
    restarts: list[float] = []
    try:
        d.start()
        ws = [_Writer(k, d.endpoint, seed * 1000 + k, stop, timeout_ms, pace_s, op_deadline_s)
              for k in range(writers)]
        for w in ws:
            w.start()
        done = 0
        while done < kills:
            time.sleep(rng.uniform(min_gap_ms, max_gap_ms) / 1000)
            d.kill()
            done += 1
            restarts.append(_restart(d))
            if any(w.errors for w in ws):
                break
            if progress is not None and done % 25 == 0:
                progress(done, sum(w.writes for w in ws))
        stop.set()
        for w in ws:
            w.join(op_deadline_s + 30)
        # The verdict, after one more clean restart from the crash-loop log (no snapshot yet).
        d.kill()
        _restart(d)
        with d.client(timeout_ms=30_000) as c:
            stored = c.all_messages()
            health = c.health()
        return _verdict(ws, stored, health, done, restarts, time.monotonic() - t0, d)
    finally:
        stop.set()
        pool.close_all()


def _restart(d: Daemon) -> float:
    t = time.monotonic()
    d.start()
    return time.monotonic() - t


def _verdict(ws: list[_Writer], stored: list[dict[str, Any]], health: dict[str, Any], kills: int,
             restarts: list[float], seconds: float, d: Daemon) -> dict[str, Any]:
    expected: dict[str, tuple[str, str, int]] = {}
    deleted: set[str] = set()
    for w in ws:
        expected.update(w.live)
        deleted |= w.deleted
    by_id = {m["message_id"]: m for m in stored}
    tokens = Counter(m["content"] for m in stored)
    lost = [mid for mid, (session, content, rev) in expected.items()
            if mid not in by_id or (by_id[mid]["session_id"], by_id[mid]["content"], by_id[mid]["revision"])
            != (session, content, rev)]
    resurrected = [mid for mid in deleted if mid in by_id]
    duplicated = sum(n - 1 for n in tokens.values() if n > 1) + (len(stored) - len(by_id))
    unexpected = [mid for mid in by_id if mid not in expected and mid not in deleted]
    return {
        "kills": kills,
        "writers": len(ws),
        "acknowledged": sum(w.writes for w in ws),
        "acknowledged_updates": sum(w.updates for w in ws),
        "acknowledged_deletes": sum(w.deletes for w in ws),
        "lost": len(lost) + len(resurrected),
        "duplicated": duplicated + len(unexpected),
        "lost_ids": (lost + resurrected)[:20],
        "unexpected_ids": unexpected[:20],
        "stored_messages": len(stored),
        "expected_messages": len(expected),
        "health_active_messages": health.get("active_messages"),
        "health_status": health.get("status"),
        "retries": sum(w.retries for w in ws),
        "errors": [e for w in ws for e in w.errors][:20],
        "restart_s_max": round(max(restarts), 3) if restarts else 0.0,
        "restart_s_mean": round(sum(restarts) / len(restarts), 3) if restarts else 0.0,
        "log_size": health.get("log_size"),
        "seconds": round(seconds, 1),
        "daemon_runs": d.runs,
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="bench.crash_loop", description=__doc__.splitlines()[0])
    p.add_argument("--kills", type=int, default=300)
    p.add_argument("--writers", type=int, default=4)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--pace-ms", type=float, default=10.0, help="mean pause of each writer between requests")
    p.add_argument("--min-gap-ms", type=int, default=50, help="shortest time a daemon lives before the kill")
    p.add_argument("--max-gap-ms", type=int, default=400, help="longest time a daemon lives before the kill")
    p.add_argument("--timeout-ms", type=int, default=500, help="client timeout before a Lazy-Pirate retry")
    p.add_argument("--dir", help="work directory (default: a temporary one, removed afterwards)")
    p.add_argument("--json", help="write the figures to this file")
    p.add_argument("--quiet", action="store_true")
    a = p.parse_args(argv)

    base = a.dir or tempfile.mkdtemp(prefix="convmem-crash-")
    try:
        def progress(kills: int, writes: int) -> None:
            if not a.quiet:
                print(f"  {kills} kills, {writes} acknowledged writes", file=sys.stderr, flush=True)

        r = crash_loop(base, kills=a.kills, writers=a.writers, seed=a.seed, min_gap_ms=a.min_gap_ms,
                       max_gap_ms=a.max_gap_ms, timeout_ms=a.timeout_ms, pace_s=a.pace_ms / 1000,
                       progress=progress)
    finally:
        if not a.dir:
            shutil.rmtree(base, ignore_errors=True)
    print(f"crash_loop: kills={r['kills']} acknowledged={r['acknowledged']} lost={r['lost']} "
          f"duplicated={r['duplicated']} (updates={r['acknowledged_updates']} deletes={r['acknowledged_deletes']} "
          f"retries={r['retries']} restart_mean={r['restart_s_mean']}s restart_max={r['restart_s_max']}s "
          f"{r['seconds']}s)")
    if r["errors"]:
        print("errors: " + "; ".join(r["errors"]), file=sys.stderr)
    if a.json:
        with open(a.json, "w") as f:
            json.dump(r, f, indent=2)
    ok = r["lost"] == 0 and r["duplicated"] == 0 and not r["errors"] and r["kills"] == a.kills
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
