"""The request loop: one ZeroMQ ROUTER socket serving REQ clients, one request at a time, a
rebuild beside it.

ROUTER rather than REP: libzmq's REP (4.3.5) loses the next client's reply after a peer sent a
multi-frame message without the REQ delimiter and went away (router_t::rollback leaves its
``_more_out`` set when the peer's pipe is gone). Handling the REQ envelope here avoids that path.

All socket calls stay in this thread. A rebuild runs in a worker thread that only reads the
(frozen) state and writes temporary files; it wakes the loop through an inproc PAIR socket when
done, and the loop installs the result. Meanwhile mutations are answered BUSY at once and reads
are served from the unchanged state.
"""
from __future__ import annotations

import logging
import os
import signal
import threading
import time
import traceback
from typing import Any, Callable

import zmq

from protocol import errors as E
from protocol import limits as L
from protocol import wire
from protocol.errors import ProtocolError, error_reply

from . import compaction, views
from .store import Store

LOG = logging.getLogger("convmem.storaged")

# Frames above this are dropped by libzmq itself (the peer is disconnected) to bound memory;
# frames between MAX_REQUEST_BYTES and this get a clear VALIDATION_ERROR reply.
HARD_FRAME_CAP = 4 * L.MAX_REQUEST_BYTES
REBUILD_RESULTS_KEPT = 32
POLL_MS = 100


class RebuildCancelled(Exception):
    pass


class Server:
    def __init__(self, store: Store, endpoint: str, curve_secret_key: bytes | None = None) -> None:
        self.store = store
        self.endpoint = endpoint
        self.ctx = zmq.Context.instance()
        self.sock = self.ctx.socket(zmq.ROUTER)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.setsockopt(zmq.MAXMSGSIZE, HARD_FRAME_CAP)
        if curve_secret_key is not None:
            self.sock.curve_secretkey = curve_secret_key
            self.sock.curve_server = True
        self.wake_addr = f"inproc://convmem-rebuild-{id(self)}"
        self.wake_recv = self.ctx.socket(zmq.PAIR)
        self.wake_recv.bind(self.wake_addr)
        self.stopping = False
        self.rebuild_id: str | None = None
        self.rebuild_thread: threading.Thread | None = None
        self.rebuild_outcome: tuple[str, Any] | None = None  # ("ok", Prepared) | ("error", reply)
        self.rebuild_cancel = threading.Event()
        self.rebuild_results: dict[str, dict[str, Any]] = {}
        self.rebuild_started = 0.0
        self.handlers: dict[str, Callable[[dict[str, Any], str], dict[str, Any]]] = {
            "ping": self._ping,
            "write_message": lambda a, rid: store.write_message(a, rid),
            "update_message": lambda a, rid: store.update_message(a, rid),
            "delete_message": lambda a, rid: store.delete_message(a, rid),
            "read_messages": lambda a, rid: views.read_messages(store, a),
            "search_messages": lambda a, rid: views.search_messages(store, a),
            "get_system_health": self._health,
            "rebuild_index": self._rebuild_index,
            "rebuild_status": self._rebuild_status,
            "import_messages": lambda a, rid: store.import_messages(a, rid),
        }

    def bind(self) -> None:
        self.sock.bind(self.endpoint)

    # ---------------------------------------------------------------- the loop
    def serve(self) -> None:
        poller = zmq.Poller()
        poller.register(self.sock, zmq.POLLIN)
        poller.register(self.wake_recv, zmq.POLLIN)
        while not self.stopping:
            events = dict(poller.poll(POLL_MS))
            if self.wake_recv in events:
                self.wake_recv.recv()
                self._finish_rebuild()
            if self.sock in events:
                try:
                    frames = self.sock.recv_multipart(zmq.NOBLOCK)
                except zmq.Again:
                    continue
                envelope, body = split_envelope(frames)
                if envelope is None:
                    continue  # no REQ delimiter: not a request (a REP socket drops these too)
                self.sock.send_multipart([*envelope, wire.encode(self.handle(body))])

    def handle(self, frames: list[bytes]) -> dict[str, Any]:
        """Any bytes in, one reply out. Never raises."""
        try:
            if len(frames) != 1:
                raise E.invalid("request must be a single frame")
            op, args, rid = wire.decode_request(frames[0])
            return self.handlers[op](args, rid)
        except ProtocolError as exc:
            return exc.reply()
        except MemoryError:
            LOG.error("out of memory while handling a request")
            return error_reply(E.INTERNAL_ERROR, "the daemon ran out of memory for this request")
        except Exception:
            LOG.error("internal error while handling a request:\n%s", traceback.format_exc())
            return error_reply(E.INTERNAL_ERROR, "internal error in the storage daemon (see its log)")

    def stop(self, *_: Any) -> None:
        self.stopping = True

    # ---------------------------------------------------------------- small ops
    def _ping(self, args: dict[str, Any], rid: str) -> dict[str, Any]:
        return {"status": "OK", "pid": os.getpid(), "rebuilding": self.store.rebuilding}

    def _health(self, args: dict[str, Any], rid: str) -> dict[str, Any]:
        health = self.store.health()
        health["rebuilding"] = self.store.rebuilding
        return health

    # ---------------------------------------------------------------- rebuild beside the loop
    def _rebuild_index(self, args: dict[str, Any], rid: str) -> dict[str, Any]:
        if rid in self.rebuild_results:
            return self.rebuild_results[rid]
        if self.store.rebuilding:
            if rid == self.rebuild_id:
                return self._rebuilding_reply()
            raise ProtocolError(E.BUSY, "another rebuild_index is running; retry shortly",
                                retry_after_ms=L.BUSY_RETRY_AFTER_MS)
        self.store._check_writable()
        self.store.rebuilding = True
        self.rebuild_id = rid
        self.rebuild_outcome = None
        self.rebuild_cancel.clear()
        self.rebuild_started = time.monotonic()
        LOG.info("rebuild %s started (%d messages, log %d bytes)", rid, len(self.store.by_id),
                 self.store.log_size())
        self.rebuild_thread = threading.Thread(target=self._rebuild_worker, name="rebuild", daemon=True)
        self.rebuild_thread.start()
        return self._rebuilding_reply()

    def _rebuilding_reply(self) -> dict[str, Any]:
        return {"status": wire.REBUILDING, "rebuild_id": self.rebuild_id, "retry_after_ms": 50}

    def _rebuild_worker(self) -> None:
        def pause() -> None:
            if self.rebuild_cancel.is_set():
                raise RebuildCancelled()
            time.sleep(0)  # let the request loop take the GIL between batches

        try:
            self.rebuild_outcome = ("ok", compaction.prepare(self.store, pause))
        except RebuildCancelled:
            self.rebuild_outcome = ("cancelled", None)
        except OSError as exc:
            self.rebuild_outcome = ("error", error_reply(E.IO_ERROR, f"rebuild failed writing its files "
                                                                     f"({exc.strerror or 'I/O error'}); the store is unchanged"))
        except Exception:
            LOG.error("rebuild failed:\n%s", traceback.format_exc())
            self.rebuild_outcome = ("error", error_reply(E.INTERNAL_ERROR, "rebuild failed; the store is unchanged"))
        wake = self.ctx.socket(zmq.PAIR)
        wake.connect(self.wake_addr)
        wake.send(b"done")
        wake.close(linger=1000)

    def _finish_rebuild(self) -> None:
        if self.rebuild_thread is not None:
            self.rebuild_thread.join()
        kind, value = self.rebuild_outcome or ("error", error_reply(E.INTERNAL_ERROR, "rebuild ended without result"))
        rid = self.rebuild_id
        if kind == "ok":
            try:
                reply = compaction.install(self.store, value)
            except OSError as exc:
                compaction.discard(self.store)
                self.store.last_error = f"rebuild could not install its files ({exc.strerror or exc})"
                reply = error_reply(E.IO_ERROR, "rebuild could not install its files; restart the daemon")
                self.store.broken = self.store.last_error
            LOG.info("rebuild %s finished in %.2f s: %s", rid, time.monotonic() - self.rebuild_started, reply)
        else:
            compaction.discard(self.store)
            reply = value if kind == "error" else error_reply(E.BUSY, "rebuild was cancelled by a shutdown",
                                                               retry_after_ms=1000)
            LOG.warning("rebuild %s did not complete: %s", rid, reply)
        self.store.rebuilding = False
        self.rebuild_thread = None
        self.rebuild_id = None
        if rid is not None:
            self.rebuild_results[rid] = reply
            while len(self.rebuild_results) > REBUILD_RESULTS_KEPT:
                self.rebuild_results.pop(next(iter(self.rebuild_results)))

    def _rebuild_status(self, args: dict[str, Any], rid: str) -> dict[str, Any]:
        wanted = args["rebuild_id"]
        if self.store.rebuilding and wanted == self.rebuild_id:
            return self._rebuilding_reply()
        if wanted in self.rebuild_results:
            return self.rebuild_results[wanted]
        raise ProtocolError(E.NOT_FOUND, "no rebuild with this rebuild_id is known (the daemon may have restarted)")

    def cancel_rebuild(self) -> None:
        if self.rebuild_thread is not None:
            self.rebuild_cancel.set()
            self.rebuild_thread.join()
            self._finish_rebuild()

    def close(self) -> None:
        self.cancel_rebuild()
        self.sock.close(linger=0)
        self.wake_recv.close(linger=0)


def split_envelope(frames: list[bytes]) -> tuple[list[bytes] | None, list[bytes]]:
    """(routing frames up to and including the empty delimiter, request frames); (None, []) without one."""
    for i in range(1, len(frames)):
        if not frames[i]:
            return frames[:i + 1], frames[i + 1:]
    return None, []


def install_signal_handlers(server: Server) -> None:
    signal.signal(signal.SIGTERM, server.stop)
    signal.signal(signal.SIGINT, server.stop)
