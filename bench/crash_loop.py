"""A long crash loop: concurrent writers through the daemon protocol while the daemon is SIGKILLed
at random moments and restarted; then every acknowledged write, update and delete is checked.

    python -m bench.crash_loop [--kills 300] [--writers 4] [--seed 1] [--pace-ms 10] [--json out.json]

Prints one line: kills, acknowledged, lost, duplicated (the last two must be 0). Exit status 1 if
anything was lost or duplicated or a request went unanswered. The engine is the one the test suite
runs (``tests/daemon_proc.py``), here with more kills.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)
sys.path.insert(0, os.path.join(REPO, "tests"))

from daemon_proc import crash_loop  # noqa: E402


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
