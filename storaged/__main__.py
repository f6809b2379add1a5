"""``convmem-storaged``: run the storage daemon in the foreground, or repair a damaged log.

Exit codes: 0 clean stop, 2 bad command line or configuration (``protocol.config.DAEMON_EXIT_CANNOT_START``),
3 the data directory is owned by another live daemon (``DAEMON_EXIT_LOCKED``), 75 a batch's shared
fdatasync failed (``server.EXIT_FSYNC_FAILED``: nothing of it was acknowledged; a restart replays what
reached the disk), 1 anything else.
"""
from __future__ import annotations

import argparse
import ipaddress
import json
import logging
import math
import os
import sys
import time
from urllib.parse import urlparse

import zmq

from protocol.config import (DAEMON_EXIT_CANNOT_START, DAEMON_EXIT_LOCKED, DAEMON_FAIL_PREFIX, DATA_DIR_HELP,
                             curve_clients_dir, default_data_dir, default_endpoint)

from . import datadir, identity
from .fileio import set_drop_pages
from .salvage import salvage
from .search import NATIVE_POSTINGS_ENV, NATIVE_POSTINGS_OFF, native_postings
from .server import (MAPPED_RESIDENT_CAP, MAPPED_RESIDENT_MIN, RELEASE_IDLE_S, SNAPSHOT_EVERY_RECORDS, Server,
                     install_signal_handlers)
from .store import Store

LOG = logging.getLogger("convmem.storaged")
IPC_PATH_MAX = 107  # sun_path
STOP_INDEX_BUDGET_S = 5.0  # search indexing done at a clean stop before the snapshot (see serve's finally)
# a clean stop writes no snapshot while more messages than this still move to a rebuilt log (~1.5 µs
# each: all 5M at once made a stop right after a rebuild take 10 s, a supervisor's stop timeout)
STOP_RELOCATE_MAX = 1_000_000


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="convmem-storaged", description="convmem storage daemon")
    p.add_argument("--data-dir", help=DATA_DIR_HELP)
    p.add_argument("--endpoint", help="ZeroMQ endpoint (default: $CONVMEM_ENDPOINT, else ipc:// in DATA_DIR/run)")
    p.add_argument("--curve-secret-key-file", help="Z85 CURVE secret key of the daemon; required for tcp://")
    p.add_argument("--allow-non-loopback", action="store_true", help="allow a tcp:// endpoint on a non-loopback address")
    p.add_argument("--curve-clients-dir", metavar="DIR",
                   help="tcp://: the allow-list, a directory of client public-key certificates (*.key, as written "
                        "by zmq.auth.create_certificates); default DATA_DIR/curve/clients when it exists")
    p.add_argument("--curve-allow-any", action="store_true",
                   help="tcp://: accept any client that knows the server key (no allow-list)")
    p.add_argument("--salvage", action="store_true", help="repair a log damaged before its end, then exit")
    p.add_argument("--snapshot-every", type=int, default=None, metavar="RECORDS",
                   help=f"take a background snapshot after this many log records (default {SNAPSHOT_EVERY_RECORDS}; "
                        "0: only at clean stops and rebuilds)")
    p.add_argument("--release-idle-s", type=float, default=None, metavar="SECONDS",
                   help="after this many seconds with no request, let go of the resident pages of the store's "
                        "mapped files (the page cache keeps them; "
                        f"default {RELEASE_IDLE_S:g}; 0: never, not even those a start or "
                        "a rebuild read)")
    p.add_argument("--mapped-resident-mib", type=int, default=None, metavar="MIB",
                   help="while requests come, keep the resident pages of the store's mapped files under this many "
                        "MiB, letting them go down to half of it once over "
                        f"(default {MAPPED_RESIDENT_CAP >> 20}; at least {MAPPED_RESIDENT_MIN >> 20}; 0: no cap)")
    p.add_argument("--log-level", default=os.environ.get("CONVMEM_LOG_LEVEL", "INFO"))
    p.add_argument("--log-file", metavar="PATH",
                   help="once the store is open, append the log to PATH instead of stderr (what a front-end that "
                        "starts the daemon uses: a start-up failure still goes to stderr, where it reads it)")
    return p.parse_args(argv)


def apply_tuning(server: Server, args: argparse.Namespace) -> None:
    """The options that tune the loop, clamped here, not refused: a negative period or cap means
    "off", as 0 does, and a cap under the least the daemon can keep (its own code's pages) is raised to
    it rather than letting the cap fire after every request."""
    if args.snapshot_every is not None:
        server.snapshot_every_records = max(0, args.snapshot_every)
    if args.release_idle_s is not None:
        server.release_idle_s = max(0.0, args.release_idle_s) if math.isfinite(args.release_idle_s) else 0.0
        set_drop_pages(server.release_idle_s > 0)   # 0: never, not after a start or a rebuild either
    if args.mapped_resident_mib is not None:
        server.mapped_resident_cap = (0 if args.mapped_resident_mib <= 0
                                      else max(MAPPED_RESIDENT_MIN, args.mapped_resident_mib << 20))


def fail(msg: str, code: int) -> int:
    print(f"{DAEMON_FAIL_PREFIX}{msg}", file=sys.stderr)
    return code


def check_curve_clients(data_dir: str, args: argparse.Namespace) -> tuple[str | None, str | None]:
    """(error, allow-list directory). A tcp:// daemon authenticates its clients by public key unless
    --curve-allow-any says explicitly that knowing the server key is enough."""
    if args.curve_allow_any:
        if args.curve_clients_dir:
            return "give either --curve-clients-dir or --curve-allow-any, not both", None
        LOG.warning("--curve-allow-any: any client that knows the server's public key may connect")
        return None, None
    path = args.curve_clients_dir or curve_clients_dir(data_dir)
    if not os.path.isdir(path):
        if args.curve_clients_dir:
            return f"the CURVE clients directory {path} does not exist", None
        return (f"a tcp:// endpoint needs an allow-list of client public keys: put their certificates (*.key, "
                f"zmq.auth.create_certificates) in {path} or pass --curve-clients-dir, or pass "
                f"--curve-allow-any to accept any client that knows the server key"), None
    import zmq.auth

    try:
        keys = zmq.auth.load_certificates(path)
    except (OSError, ValueError) as exc:
        return f"cannot read the CURVE client certificates in {path}: {exc}", None
    if not keys:
        LOG.warning("the CURVE allow-list %s holds no *.key certificate: no client can connect", path)
    LOG.info("CURVE: %d client key(s) allowed (from %s)", len(keys), path)
    return None, path


def check_endpoint(endpoint: str, args: argparse.Namespace) -> tuple[str | None, bytes | None]:
    """(error, curve secret key). TCP needs keys and, unless allowed, a loopback address."""
    if endpoint.startswith("ipc://"):
        if len(endpoint[len("ipc://"):].encode()) > IPC_PATH_MAX:
            return ("the ipc socket path is too long for the OS; set --endpoint or CONVMEM_ENDPOINT "
                    "to a shorter ipc:// path"), None
        return None, None
    if endpoint.startswith("tcp://"):
        host = urlparse(endpoint).hostname or ""
        try:
            loopback = host == "localhost" or ipaddress.ip_address(host).is_loopback
        except ValueError:
            loopback = False
        if not loopback and not args.allow_non_loopback:
            return "tcp:// endpoints must be on a loopback address unless --allow-non-loopback is given", None
        key_file = args.curve_secret_key_file or os.environ.get("CONVMEM_CURVE_SECRET_KEY_FILE")
        if not key_file:
            return ("a tcp:// endpoint requires ZeroMQ CURVE keys: pass --curve-secret-key-file "
                    "(generate a pair with python -c 'import zmq; print(zmq.curve_keypair())')"), None
        try:
            with open(key_file, "rb") as f:
                key = f.read().strip()
        except OSError as exc:
            return f"cannot read the CURVE secret key file: {exc.strerror}", None
        if len(key) != 40:
            return "the CURVE secret key file must hold a 40-character Z85 key", None
        return None, key
    if endpoint.startswith("inproc://"):
        return "inproc:// endpoints are not reachable from other processes", None
    return "the endpoint must be ipc:// or tcp://", None


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    logging.basicConfig(stream=sys.stderr, level=args.log_level.upper(),
                        format="%(asctime)s convmem-storaged[%(process)d] %(levelname)s %(message)s")
    data_dir = os.path.abspath(args.data_dir or default_data_dir())
    os.umask(0o077)  # whatever the daemon creates (files, dirs, the ipc socket) is this user's alone
    try:
        if datadir.create_data_dir(data_dir):
            LOG.warning("created a new, empty store in %s", data_dir)
        datadir.check_private(data_dir)
    except datadir.DataDirMissing as exc:
        return fail(str(exc), DAEMON_EXIT_CANNOT_START)
    except datadir.NotPrivate as exc:
        return fail(f"refusing the data directory: {exc}", DAEMON_EXIT_CANNOT_START)
    except OSError as exc:
        return fail(f"cannot use the data directory {data_dir}: {exc.strerror}", DAEMON_EXIT_CANNOT_START)
    lock = datadir.DataDirLock(data_dir)
    try:
        lock.acquire()
    except datadir.AlreadyRunning as exc:
        return fail(str(exc), DAEMON_EXIT_LOCKED)
    except OSError as exc:
        return fail(f"cannot use the data directory {data_dir}: {exc.strerror}", DAEMON_EXIT_CANNOT_START)
    try:
        if args.salvage:
            return run_salvage(data_dir)
        return run_daemon(data_dir, args)
    finally:
        lock.release()


def switch_log(path: str) -> None:
    """From now on stderr (and so the log) goes to ``path``: the front-end that started this daemon read
    its start-up through a pipe and stops reading once the daemon is ready."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW, 0o600)
    except OSError as exc:
        LOG.warning("cannot open the log file %s (%s); logging to stderr", path, exc.strerror)
        return
    os.dup2(fd, 2)
    os.close(fd)


def run_salvage(data_dir: str) -> int:
    try:
        report = salvage(data_dir)
    except Exception as exc:
        return fail(f"salvage failed: {exc}", 1)
    print(json.dumps(report, indent=2))
    LOG.info("salvage done: %s", report)
    return 0


def run_daemon(data_dir: str, args: argparse.Namespace) -> int:
    endpoint = args.endpoint or default_endpoint(data_dir)
    error, curve_key = check_endpoint(endpoint, args)
    clients_dir = None
    if not error and curve_key is not None:
        error, clients_dir = check_curve_clients(data_dir, args)
    if error:
        return fail(error, DAEMON_EXIT_CANNOT_START)
    datadir.prepare_run_dir(data_dir)
    try:
        store_id = identity.load_or_create_store_id(data_dir)
    except OSError as exc:
        return fail(f"cannot write the store id in {data_dir}: {exc.strerror}", DAEMON_EXIT_CANNOT_START)
    claim = identity.EndpointClaim(endpoint)
    try:
        claim.claim()  # a live daemon of another data dir keeps its endpoint
    except identity.EndpointInUse as exc:
        claim.release()
        return fail(str(exc), DAEMON_EXIT_CANNOT_START)
    except OSError as exc:
        claim.release()
        return fail(f"cannot use the endpoint {endpoint}: {exc.strerror}", DAEMON_EXIT_CANNOT_START)
    server = Server(None, endpoint, curve_key, clients_dir)
    server.identity = identity.identity(data_dir, store_id)
    apply_tuning(server, args)
    try:
        server.bind()
    except zmq.ZMQError as exc:
        server.close()
        claim.release()
        return fail(f"cannot bind {endpoint}: {exc}", DAEMON_EXIT_CANNOT_START)
    claim.bound()
    install_signal_handlers(server)
    datadir.write_pid(data_dir)
    t0 = time.monotonic()

    def loaded(store: Store) -> None:
        if args.log_file:  # started by a front-end: it has read the start-up; the rest goes to the log file
            switch_log(args.log_file)
        # (not store.health(): its memory estimate walks every session, ~0.2 s at 91k, before the first request)
        segments, mapped = store.index_segments()
        LOG.info("opened %s in %.2f s: %d messages in %d sessions, log %d bytes, replayed %d records after the "
                 "snapshot, snapshot_valid=%s, recovered_tail=%s, search index segments %d (%.1f MiB mapped)%s",
                 data_dir, time.monotonic() - t0, len(store.by_id), len(store.sessions), store.log_size(),
                 store.scan_result.records, store.snapshot_valid, store.recovered_tail, segments, mapped / 2**20,
                 f", DEGRADED: {store.last_error}" if store.last_error else "")
        LOG.info("ready on %s; MCP hosts reach it through `convmem-mcp --data-dir %s`, `convmem status` "
                 "shows it, Ctrl-C or `convmem stop --data-dir %s` stops it", endpoint, data_dir, data_dir)

    server.on_loaded = loaded
    if not native_postings():
        LOG.warning("the search index's native posting builder (convmem_postings, storaged/postings.c) is %s: "
                    "indexing runs in Python, ~1.6x slower (reinstall where a C compiler is)",
                    f"off ({NATIVE_POSTINGS_ENV} is set)" if NATIVE_POSTINGS_OFF else "not installed")
    LOG.info("listening on %s; opening the store (requests are answered 'loading' until it is open)", endpoint)
    # a fault-injection seam for tests: a store that takes this long to open (as a large one does)
    delay = float(os.environ.get("CONVMEM_FAULT_LOAD_DELAY_S") or 0)

    def open_store() -> Store:
        if delay > 0:
            time.sleep(delay)
        return Store.open(data_dir)

    server.load_in_background(open_store)
    try:
        server.serve()
    finally:
        server.close()
        claim.release()  # the socket file goes with a clean stop (if it is still ours)
        store = server.store
        if store is not None:
            t1 = time.monotonic()
            if store.unindexed and not store.corrupt:
                # what the search index still has queued goes into the snapshot's index if it fits a
                # few seconds (a supervisor's stop timeout is 10 s by default); the rest stays queued
                more = store.index_step(t1 + STOP_INDEX_BUDGET_S)
                LOG.info("indexed the search queue for %.2f s at shutdown%s", time.monotonic() - t1,
                         f"; {len(store.unindexed)} messages stay queued" if more else "")
            try:
                # (a base due is left to the next start's background snapshot, when there are any)
                moving = store.relocation_left()
                if store.write_snapshot(base_later=server.snapshot_every_records > 0, relocate_max=STOP_RELOCATE_MAX):
                    LOG.info("snapshot written in %.2f s", time.monotonic() - t1)
                elif moving > STOP_RELOCATE_MAX:
                    LOG.info("no snapshot at this stop: %d messages were still moving to the rebuilt log; the "
                             "rebuild's snapshot stays, and the next start replays what was written after it", moving)
            except OSError as exc:
                LOG.error("could not write the snapshot at shutdown (%s); the log is intact", exc.strerror)
            except Exception:   # a bug must not skip closing the log and removing the pid file
                LOG.exception("could not write the snapshot at shutdown; the log is intact")
            store.close()
        datadir.remove_pid(data_dir)
        LOG.info("stopped")
    if server.load_error is not None:
        return fail(f"cannot open the data directory {data_dir}: {server.load_error}", 1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
