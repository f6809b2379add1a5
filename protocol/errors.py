"""Error codes of the tool contract and the one exception type that carries them.

The reply shape is the contract's: ``{"status": "ERROR", "error": {"code": ..., "message": ...}}``.
Messages name the field and the constraint; they never echo what the caller sent, so a secret
pasted into the wrong field can never come back in an error (or land in a log).
"""
from __future__ import annotations

from typing import Any

VALIDATION_ERROR = "VALIDATION_ERROR"
NOT_FOUND = "NOT_FOUND"
CONFLICT = "CONFLICT"
BUSY = "BUSY"
IO_ERROR = "IO_ERROR"
CORRUPT_STORE = "CORRUPT_STORE"
INTERNAL_ERROR = "INTERNAL_ERROR"

ERROR_CODES = (VALIDATION_ERROR, NOT_FOUND, CONFLICT, BUSY, IO_ERROR, CORRUPT_STORE, INTERNAL_ERROR)

# Codes after which the very same request may succeed if sent again later.
RETRYABLE = frozenset({BUSY})


class ProtocolError(Exception):
    """A failure that becomes a contract error reply."""

    def __init__(self, code: str, message: str, retry_after_ms: int | None = None) -> None:
        assert code in ERROR_CODES, code
        super().__init__(message)
        self.code = code
        self.message = message
        self.retry_after_ms = retry_after_ms

    def reply(self) -> dict[str, Any]:
        return error_reply(self.code, self.message, self.retry_after_ms)


def error_reply(code: str, message: str, retry_after_ms: int | None = None) -> dict[str, Any]:
    err: dict[str, Any] = {"code": code, "message": message}
    if retry_after_ms is not None:
        err["retryable"] = True
        err["retry_after_ms"] = int(retry_after_ms)
    return {"status": "ERROR", "error": err}


def outcome_unknown(request_id: str, retry_after_ms: int) -> dict[str, Any]:
    """A mutation whose fate the caller cannot know: the daemon stopped answering after the request may
    have reached it. Still the contract's shape and a contract code (BUSY: call again later), marked
    so, and carrying the request id: the same call sent again with that ``request_id`` is applied at
    most once, whatever happened to the first."""
    reply = error_reply(BUSY, "the storage daemon did not answer in time, so this change may or may not have been "
                              "applied; call again with this request_id to apply it exactly once", retry_after_ms)
    reply["error"]["outcome_unknown"] = True
    reply["error"]["request_id"] = request_id
    return reply


def is_error_reply(reply: Any) -> bool:
    return isinstance(reply, dict) and reply.get("status") == "ERROR"


def invalid(message: str) -> ProtocolError:
    return ProtocolError(VALIDATION_ERROR, message)
