"""The daemon's wire format: one msgpack map per request and per reply.

Request: ``{"op": str, "args": map, "request_id": ULID}``, plus ``"context"`` (what the front-end found
about its launch directory) for the ops in ``history.LAUNCH_CONTEXT_TOOLS``. Reply: the tool's result object exactly
as the contract shapes it (an error is ``{"status": "ERROR", "error": {...}}``). Decoding treats
every byte as hostile: the size is checked before parsing, the work of unpacking is bounded while it
happens (entries per container, containers per frame), then the nesting depth and the shape are checked.
"""
from __future__ import annotations

import dataclasses
from typing import Any

import msgpack

from . import history as H
from . import limits as L
from .errors import invalid
from .validation import VALIDATORS, canonical_ulid

# The first interface (memory): seven tools, the contract's codes and shapes.
TOOLS = (
    "write_message", "update_message", "read_messages", "search_messages", "delete_message",
    "rebuild_index", "get_system_health",
)
# The second interface (agent history): five read-only tools, their own envelope and codes.
HISTORY_TOOLS = H.HISTORY_TOOLS
# Daemon-only ops: a liveness probe and the poll that tells a rebuild's requester how it ended;
# import_messages / export_messages, the admin tool's and the ingester's batch write and the admin tool's
# full read; the ingest ops, how transcript ingesters report progress and read back where they stopped.
OPS = frozenset(TOOLS) | frozenset(HISTORY_TOOLS) | {"ping", "rebuild_status", "import_messages", "export_messages",
                                                     "ingest_heartbeat", "ingest_checkpoints"}
# The tools that change nothing stored (their MCP annotations say read-only).
READ_ONLY_TOOLS = frozenset({"read_messages", "search_messages", "get_system_health", *HISTORY_TOOLS})
_ALL_VALIDATORS = {**VALIDATORS, **H.HISTORY_VALIDATORS, "ingest_heartbeat": H.validate_ingest_heartbeat,
                   "ingest_checkpoints": H.validate_ingest_checkpoints}

# Non-final answer to rebuild_index: poll rebuild_status with the same id until it changes.
REBUILDING = "REBUILDING"
# Set (true) on a reply that only says "the daemon is still opening its store": nothing was done,
# the same request may be sent again after the reply's retry_after_ms.
LOADING_KEY = "loading"


def encode(obj: Any) -> bytes:
    return msgpack.packb(obj, use_bin_type=True)


def encode_request(op: str, args: dict[str, Any], request_id: str, context: dict[str, Any] | None = None) -> bytes:
    req = {"op": op, "args": args, "request_id": request_id}
    if context is not None:
        req["context"] = context
    return encode(req)


def _depth_ok(obj: Any, limit: int) -> bool:
    """Iterative (a hostile frame cannot exhaust the Python stack) and level by level over containers
    only, so a batch of a thousand messages costs a few thousand type checks, not a walk of every
    string in it. Map keys need no visit: ``strict_map_key`` already made them str or bytes."""
    level = [obj] if isinstance(obj, (dict, list)) else []
    depth = 1
    while level:
        if depth > limit:
            return False
        nxt: list[Any] = []
        for node in level:
            children = node.values() if type(node) is dict else node
            nxt.extend(c for c in children if type(c) is dict or type(c) is list)
        level = nxt
        depth += 1
    return True


class _ContainerBudget:
    """Counts the maps and arrays msgpack builds (its ``object_hook``/``list_hook`` run as each one
    is completed, inside the C unpacker) and stops the unpacking once there are too many: the work
    and the memory of decoding a frame are bounded while it happens, not checked afterwards."""

    __slots__ = ("left",)

    def __init__(self, limit: int) -> None:
        self.left = limit

    def __call__(self, obj: Any) -> Any:
        self.left -= 1
        if self.left < 0:
            raise _TooManyContainers()
        return obj


class _TooManyContainers(Exception):
    pass


def decode(frame: bytes, max_bytes: int = L.MAX_REQUEST_BYTES) -> Any:
    """A frame's object, with every size bounded while msgpack unpacks it: the frame's length, each
    array's and map's entry count (checked against the header before anything is allocated), the
    total number of containers, no ext types; then the nesting depth (cheap: few containers)."""
    if len(frame) > max_bytes:
        raise invalid(f"request frame must be at most {max_bytes} bytes")
    budget = _ContainerBudget(L.MAX_REQUEST_CONTAINERS)
    try:
        obj = msgpack.unpackb(frame, raw=False, strict_map_key=True, use_list=True,
                              max_str_len=max_bytes, max_bin_len=L.MAX_REQUEST_BIN_LEN, max_ext_len=0,
                              max_array_len=L.MAX_REQUEST_ARRAY_LEN, max_map_len=L.MAX_REQUEST_MAP_LEN,
                              object_hook=budget, list_hook=budget)
    except _TooManyContainers:
        raise invalid(f"request must hold at most {L.MAX_REQUEST_CONTAINERS} maps and arrays") from None
    except Exception:  # ExtraData, FormatError, StackError, UnicodeDecodeError, ValueError (a length limit) ...
        raise invalid(f"request is not a valid msgpack message within the wire limits (arrays of at most "
                      f"{L.MAX_REQUEST_ARRAY_LEN} items, maps of at most {L.MAX_REQUEST_MAP_LEN} entries, "
                      f"no ext types)") from None
    if not _depth_ok(obj, L.MAX_NESTING_DEPTH):
        raise invalid(f"request nesting must be at most {L.MAX_NESTING_DEPTH} levels")
    return obj


def decode_envelope(frame: bytes) -> tuple[str, Any, str, Any]:
    """(op, raw args, request_id, raw context) of a well-formed envelope; raises ProtocolError."""
    obj = decode(frame)
    if not isinstance(obj, dict):
        raise invalid("request must be a map with op, args and request_id")
    extra = set(obj) - {"op", "args", "request_id", "context"}
    if extra:
        raise invalid("request has unknown envelope fields; allowed: op, args, request_id, context")
    op = obj.get("op")
    if not isinstance(op, str) or op not in OPS:
        raise invalid(f"op must be one of: {', '.join(sorted(OPS))}")
    rid = obj.get("request_id")
    if rid is None:
        raise invalid("request_id is required (a ULID)")
    rid = canonical_ulid(rid, "request_id")
    if obj.get("context") is not None and op not in H.LAUNCH_CONTEXT_TOOLS:
        raise invalid(f"{op} takes no request context")
    return op, obj.get("args"), rid, obj.get("context")


def validate_args(op: str, args: Any, context: Any = None) -> Any:
    """An op's request (``protocol.requests``) from its arguments and, for the tools that take one, the
    request context (history tools: ``HistoryError``; the rest: ``ProtocolError``)."""
    out = _ALL_VALIDATORS[op](args)
    if op in H.LAUNCH_CONTEXT_TOOLS:
        out = dataclasses.replace(out, launch=H.validate_launch(context))
    return out


def decode_request(frame: bytes) -> tuple[str, Any, str]:
    """Return (op, request, request_id). Raises ProtocolError (or HistoryError for history tools)."""
    op, args, rid, context = decode_envelope(frame)
    return op, validate_args(op, args, context), rid
