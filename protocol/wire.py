"""The daemon's wire format: one msgpack map per request and per reply.

Request: ``{"op": str, "args": map, "request_id": ULID}``. Reply: the tool's result object exactly
as the contract shapes it (an error is ``{"status": "ERROR", "error": {...}}``). Decoding treats
every byte as hostile: the size is checked before parsing, then the nesting depth and the shape.
"""
from __future__ import annotations

from typing import Any

import msgpack

from . import limits as L
from .errors import invalid
from .validation import VALIDATORS, canonical_ulid

TOOLS = (
    "write_message", "update_message", "read_messages", "search_messages", "delete_message",
    "rebuild_index", "get_system_health",
)
# Daemon-only ops: a liveness probe and the poll that tells a rebuild's requester how it ended.
# import_messages is the admin tool's batch write (export/import, agent transcripts).
OPS = frozenset(TOOLS) | {"ping", "rebuild_status", "import_messages"}
MUTATING_OPS = frozenset({"write_message", "update_message", "delete_message", "rebuild_index", "import_messages"})
READ_ONLY_TOOLS = frozenset({"read_messages", "search_messages", "get_system_health"})

# Non-final answer to rebuild_index: poll rebuild_status with the same id until it changes.
REBUILDING = "REBUILDING"


def encode(obj: Any) -> bytes:
    return msgpack.packb(obj, use_bin_type=True)


def encode_request(op: str, args: dict[str, Any], request_id: str) -> bytes:
    return encode({"op": op, "args": args, "request_id": request_id})


def _depth_ok(obj: Any, limit: int) -> bool:
    """Iterative so that a hostile frame cannot exhaust the Python stack."""
    stack = [(obj, 1)]
    while stack:
        node, depth = stack.pop()
        if isinstance(node, dict):
            if depth > limit:
                return False
            stack.extend((v, depth + 1) for v in node.values())
            stack.extend((k, depth + 1) for k in node.keys())
        elif isinstance(node, list):
            if depth > limit:
                return False
            stack.extend((v, depth + 1) for v in node)
    return True


def decode(frame: bytes, max_bytes: int = L.MAX_REQUEST_BYTES) -> Any:
    if len(frame) > max_bytes:
        raise invalid(f"request frame must be at most {max_bytes} bytes")
    try:
        obj = msgpack.unpackb(frame, raw=False, strict_map_key=True, use_list=True)
    except Exception:  # ExtraData, FormatError, StackError, UnicodeDecodeError, ValueError, TypeError ...
        raise invalid("request is not a valid msgpack message") from None
    if not _depth_ok(obj, L.MAX_NESTING_DEPTH):
        raise invalid(f"request nesting must be at most {L.MAX_NESTING_DEPTH} levels")
    return obj


def decode_request(frame: bytes) -> tuple[str, dict[str, Any], str]:
    """Return (op, validated args, request_id). Raises ProtocolError(VALIDATION_ERROR)."""
    obj = decode(frame)
    if not isinstance(obj, dict):
        raise invalid("request must be a map with op, args and request_id")
    extra = set(obj) - {"op", "args", "request_id"}
    if extra:
        raise invalid("request has unknown envelope fields; allowed: op, args, request_id")
    op = obj.get("op")
    if not isinstance(op, str) or op not in OPS:
        raise invalid(f"op must be one of: {', '.join(sorted(OPS))}")
    rid = obj.get("request_id")
    if rid is None:
        raise invalid("request_id is required (a ULID)")
    rid = canonical_ulid(rid, "request_id")
    args = VALIDATORS[op](obj.get("args"))
    return op, args, rid


def peek_request_id(frame: bytes) -> str | None:
    """Best effort: the request id of a frame that failed validation, for logging and nothing else."""
    try:
        obj = msgpack.unpackb(frame, raw=False) if len(frame) <= L.MAX_REQUEST_BYTES else None
        rid = obj.get("request_id") if isinstance(obj, dict) else None
        return rid if isinstance(rid, str) and len(rid) <= L.REQUEST_ID_MAX_BYTES else None
    except Exception:
        return None
