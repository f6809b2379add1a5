"""``convmem-ingest``: follow every agent harness's transcripts and keep the store up to date.

Runs in the foreground (a supervisord program in a deployment): a pass over all transcript files,
then one every ``--interval`` seconds, a heartbeat to the daemon all along. SIGTERM/SIGINT stop it
after the batch in hand; its checkpoints live in the daemon's store, so the next start resumes there.

Exit codes: 0 clean stop, 1 the daemon refused a request or could not be started, 2 bad command line.
A daemon that is busy or does not answer is waited for (until a stop signal), not given up on.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import signal
import sys

from protocol.config import DATA_DIR_HELP

from .service import HARNESSES, HEARTBEAT_INTERVAL_S, DaemonError, Ingester, Totals

log = logging.getLogger("convmem.ingest")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    from daemonclient.transport import DEFAULT_TIMEOUT_S

    p = argparse.ArgumentParser(prog="convmem-ingest", description="follow agent transcripts into the convmem store")
    p.add_argument("--data-dir", help=DATA_DIR_HELP)
    p.add_argument("--endpoint", help="daemon endpoint (default: $CONVMEM_ENDPOINT, else ipc:// in DATA_DIR/run)")
    p.add_argument("--no-spawn", action="store_true", help="never start a storage daemon (e.g. under supervisord)")
    p.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT_S, help="seconds per daemon request attempt")
    p.add_argument("--curve-server-key-file", help="the daemon's CURVE public key, for a tcp:// endpoint")
    p.add_argument("--curve-client-key-file", help="this client's CURVE key pair, a secret certificate whose "
                                                   "public key is on the daemon's allow-list "
                                                   "(default: $CONVMEM_CURVE_CLIENT_KEY_FILE)")
    p.add_argument("--harness", action="append", choices=HARNESSES,
                   help="only this harness (repeatable; default: all of " + ", ".join(HARNESSES) + ")")
    p.add_argument("--interval", type=float, default=HEARTBEAT_INTERVAL_S,
                   help="seconds between scans and heartbeats (default %(default)s)")
    p.add_argument("--once", action="store_true", help="one pass over every file, then exit")
    p.add_argument("--log-level", default=os.environ.get("CONVMEM_LOG_LEVEL", "INFO"))
    args = p.parse_args(argv)
    if args.interval <= 0:
        p.error("--interval must be positive")
    return args


async def run(args: argparse.Namespace) -> int:
    from daemonclient.core import connect
    from daemonclient.transport import read_curve_client_keys, read_curve_server_key

    daemon = connect(args.data_dir, args.endpoint, timeout=args.timeout,
                     curve_server_key=read_curve_server_key(args.curve_server_key_file),
                     curve_client_keys=read_curve_client_keys(args.curve_client_key_file), spawn=not args.no_spawn)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)

    harnesses = tuple(args.harness) if args.harness else HARNESSES
    ingester = Ingester(daemon.call, harnesses, interval=args.interval, stop=stop)
    totals = Totals()
    log.info("following %s transcripts into %s (every %.0f s)", ", ".join(harnesses), daemon.endpoint, args.interval)
    try:
        await ingester.run(watch=not args.once, totals=totals)
    except DaemonError as exc:
        log.error("%s", exc)
        return 1
    finally:
        daemon.close()
        print(json.dumps(totals.report()), flush=True)
    return 0


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    logging.basicConfig(stream=sys.stderr, level=args.log_level.upper(),
                        format="%(asctime)s convmem-ingest[%(process)d] %(levelname)s %(message)s")
    return asyncio.run(run(args))


if __name__ == "__main__":
    sys.exit(main())
